"""A child's console, kill and retirement go through its owner (forkd.sandbox.child.ChildHandle), on the fake VMM
driver (tests/fake_vmm.py: ordinary processes running the real guest agent), which meets the same driver contract
as QEMU (tests/test_driver_contract.py): what is tested here is the logic above the driver."""

from __future__ import annotations

import contextlib
import subprocess
from contextlib import ExitStack

import pytest

from forkd.base.errors import Conflict, NotFound
from forkd.base.procs import start_time
from forkd.core.requests import Spawn
from forkd.sandbox.child import SourceFate, SourceLost
from tests.conftest import BASE_TAG


def _one(rt):
    (rec,) = rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    return rec


def test_a_childs_console_is_read_through_its_handle(fake_rt, fake_base):
    """The VMM's console is drained into the log; a read from an offset gives what came after; an offset past
    the end (the log was cut) starts again from the beginning."""
    rec = _one(fake_rt)
    try:
        end, data = fake_rt.handles.get(rec.id).console()
        assert end == len(data) > 0
        later, rest = fake_rt.handles.get(rec.id).console(end)
        assert later >= end and len(rest) == later - end
        again, whole = fake_rt.handles.get(rec.id).console(end + 10**9)
        assert whole[:end] == data and again == len(whole)
    finally:
        fake_rt.kill([rec.id])


def test_kill_through_the_handle_stops_the_vmm_and_drops_the_record(fake_rt, fake_base):
    rec = _one(fake_rt)
    handle = fake_rt.handles.get(rec.id)
    assert handle.kill() is True
    assert start_time(rec.pid) != rec.started  # the VMM process is gone (or its pid reused)
    with pytest.raises(NotFound):
        fake_rt.child(rec.id)
    assert handle.kill() is False  # a second kill of the same child: already gone


def test_retire_keeps_a_child_that_no_longer_qualifies(fake_rt, fake_base):
    rec = _one(fake_rt)
    try:
        assert fake_rt.retire(rec.id, lambda r: False) is False
        assert fake_rt.child(rec.id).status == "running"
        assert fake_rt.retire(rec.id, lambda r: r.id == rec.id) is True
        with pytest.raises(NotFound):
            fake_rt.child(rec.id)
    finally:
        if rec.id in {c.id for c in fake_rt.children()}:
            fake_rt.kill([rec.id])


def test_a_child_another_operation_owns_is_not_killed_under_it(fake_rt, fake_base, monkeypatch):
    """A child still `starting` under a live spawner is left alone: the handle says so (None) and `kill`
    refuses naming the child, its status and the owning process."""
    monkeypatch.setenv("FORKD_KILL_WAIT_SECONDS", "0.2")
    rec = _one(fake_rt)
    owner = subprocess.Popen(["sleep", "300"])
    try:
        fake_rt.registry.save(rec.with_(state="starting", spawner_pid=owner.pid, spawner_started=start_time(owner.pid)))
        assert fake_rt.handles.get(rec.id).kill(wait_until=0) is None
        with pytest.raises(Conflict, match=rf"{rec.id} \(starting, process {owner.pid}\)"):
            fake_rt.kill([rec.id])
        assert fake_rt.child(rec.id).state == "starting"
    finally:
        owner.kill()
        owner.wait()
        fake_rt.registry.save(fake_rt.child(rec.id).with_(state="running"))
        fake_rt.kill([rec.id])


def test_a_capture_hold_connects_resumes_and_reads_the_sources_fate(fake_rt, fake_base):
    """hold_for_capture's hold: connect notes that the source ran, resume puts a paused source back, and once
    its VMM is gone (killed) the handle's fate says `dead`; once its record is gone, `removed`."""
    import os
    import signal

    from forkd.vmm.driver import VmmLost

    rec = _one(fake_rt)
    handle = fake_rt.handles.get(rec.id)
    try:
        with ExitStack() as stack:
            hold = handle.hold_for_capture(stack, max_branches=4)
            hold.connect(timeout=30)
            assert hold.was_running is True
            fake_rt.driver.pause(hold.vm)
            assert fake_rt.driver.run_state(hold.vm) != "running"
            hold.resume()
            assert fake_rt.driver.run_state(hold.vm) == "running"
        assert handle.fate(RuntimeError("a step failed")) is None
        os.kill(rec.pid, signal.SIGKILL)
        assert handle.fate(VmmLost("its socket closed")) == SourceFate("dead", rec.memory_limit_mib)
    finally:
        fake_rt.kill([rec.id])
    assert handle.fate(VmmLost("gone")) == SourceFate("removed")


def _held(fake_rt, stack, rec, pause_first: bool = False):
    hold = fake_rt.handles.get(rec.id).hold_for_capture(stack, max_branches=4)
    if pause_first:
        fake_rt.driver.pause(hold.vm)
    hold.connect(timeout=30)
    return hold


def test_a_failure_passing_the_hold_resumes_the_source_it_paused(fake_rt, fake_base):
    """Resume on exit: a failure that unwinds the hold's stack once the source was paused leaves it running; the
    failure propagates unchanged; the branch lock is let go."""
    rec = _one(fake_rt)
    try:
        with pytest.raises(RuntimeError, match="a step failed"), ExitStack() as stack:
            hold = _held(fake_rt, stack, rec)
            fake_rt.driver.pause(hold.vm)
            raise RuntimeError("a step failed")
        assert fake_rt.driver.run_state(hold.vm) == "running"
        with ExitStack() as again:
            _held(fake_rt, again, rec)  # the branch lock was released
    finally:
        fake_rt.kill([rec.id])


@pytest.mark.parametrize("why", ["paused-before", "freed", "lost", "no-failure"])
def test_the_hold_leaves_a_source_paused_when_it_is_not_its_to_resume(fake_rt, fake_base, why):
    """Not resumed on exit: a source that was paused when the hold connected (a sleeping child stays asleep), a
    hold already freed (the capture is over: the source is no longer the branch's), a source reported lost, and a
    block that ended without a failure (the capture's own steps resumed it)."""
    rec = _one(fake_rt)
    try:
        with contextlib.suppress(RuntimeError, SourceLost), ExitStack() as stack:
            hold = _held(fake_rt, stack, rec, pause_first=why == "paused-before")
            fake_rt.driver.pause(hold.vm)
            if why == "freed":
                hold.free()
            if why == "lost":
                raise SourceLost("the source child is dead", fate="dead")
            if why != "no-failure":
                raise RuntimeError("a step failed")
        assert fake_rt.driver.run_state(hold.vm) == "paused"
    finally:
        fake_rt.kill([rec.id])


def test_a_resume_that_fails_on_the_way_out_is_noted_never_raised(fake_rt, fake_base):
    """The source's VMM died under the hold: the resume on exit fails too, and says so in a note on the failure
    that is on its way out, which is what the caller gets."""
    import os
    import signal

    rec = _one(fake_rt)
    try:
        with pytest.raises(RuntimeError, match="a step failed") as ei, ExitStack() as stack:
            hold = _held(fake_rt, stack, rec)
            os.kill(rec.pid, signal.SIGKILL)
            _until_lost(fake_rt, hold)
            raise RuntimeError("a step failed")
        assert any("resuming the source failed too" in n for n in ei.value.__notes__)
    finally:
        fake_rt.kill([rec.id])


def _until_lost(fake_rt, hold) -> None:
    """Wait until the killed VMM shows as gone (the signal is delivered asynchronously)."""
    import time

    from forkd.vmm.driver import VmmLost

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            fake_rt.driver.run_state(hold.vm)
        except VmmLost:
            return
        time.sleep(0.01)
    raise AssertionError(f"the VMM {hold.vm.pid} did not go")


def test_a_freed_hold_lets_another_branch_of_the_source_start(fake_rt, fake_base):
    rec = _one(fake_rt)
    try:
        with ExitStack() as stack:
            _held(fake_rt, stack, rec).free()
            with ExitStack() as other:
                assert _held(fake_rt, other, rec).was_running
    finally:
        fake_rt.kill([rec.id])


# what a running child's VMM is asked through its driver: only its handle (forkd.sandbox) and the driver do it
HANDLE_ONLY = frozenset({"attach", "connect", "save_console", "ensure_running", "pause", "run_state"})


def test_only_the_handle_reaches_a_running_childs_vmm():
    """Above forkd.sandbox nothing attaches to, connects to, pauses, resumes or drains the console of a running
    child's VMM through the driver: it asks the child's handle (console, hold_for_capture, vmm, ensure_running)."""
    import ast
    from pathlib import Path

    import forkd

    root = Path(forkd.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in ("sandbox", "vmm"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HANDLE_ONLY
                    and ast.unparse(node.func.value).split(".")[-1] == "driver"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}")
    assert not found, "a running child's VMM reached around its handle:\n" + "\n".join(found)
