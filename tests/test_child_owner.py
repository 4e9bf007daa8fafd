"""One owner per running child (forkd.sandbox.child): residency and wakes on the record, written from its current
content; sleep refused while a request or a branch holds the child; residency shown by `forkd ls`, the API's
child view and metrics. No VM: a child's "VMM" is a plain `sleep` process of this test, and no step here reaches
the driver except where a test says so."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from forkd.api.metrics import _residency
from forkd.base.atomic import write_json
from forkd.base.locks import Flock
from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.cli.reading import child_rows
from forkd.client.wire import child_view
from forkd.core.runtime import Runtime
from forkd.sandbox import lockpaths
from forkd.sandbox.child import ChildRecord


@pytest.fixture
def local(tmp_path):
    """A runtime on an empty home, and a factory of running children whose VMM stands in as `sleep`."""
    rt = Runtime(Layout(tmp_path / "home"))
    procs: list[subprocess.Popen] = []

    def child(**kw) -> ChildRecord:
        proc = subprocess.Popen(["sleep", "300"])
        procs.append(proc)
        cid = rt.registry.new_id()
        me = os.getpid()
        return rt.registry.save(ChildRecord(
            id=cid, snapshot="s", created_at=time.time(), dir=str(rt.registry.path(cid)), memory_mib=256, vcpus=1,
            accel="tcg", pid=proc.pid, started=start_time(proc.pid), state="running", spawner_pid=me,
            spawner_started=start_time(me), **kw))

    yield rt, child
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_record_without_residency_reads_as_awake(local):
    """A record written before residency existed is an awake child with no wakes."""
    rt, child = local
    rec = child()
    raw = rec.to_json()
    del raw["residency"], raw["wakes"]
    write_json(Path(rec.dir) / "child.json", raw)
    got = rt.child(rec.id)
    assert (got.residency, got.wakes) == ("awake", 0)


def test_wakes_and_residency_are_written_from_the_current_record(local):
    """Two handles holding the same (soon stale) record: each change is applied to what the record says now, so
    neither loses the other's (two wakes count two; a claim recorded meanwhile keeps the residency)."""
    rt, child = local
    rec = child()
    a, b = rt.handles.of(rec), rt.handles.of(rec)
    a._residency("paged")
    b._woke()
    a._woke()
    assert (rt.child(rec.id).residency, rt.child(rec.id).wakes) == ("awake", 2)
    a._residency("asleep")
    (claimed,) = rt.handles.mark_claimed([rec.id], at=123.0, ends=456.0)
    now = rt.child(rec.id)
    assert (now.residency, now.wakes, now.claimed_at, now.expires_at) == ("asleep", 2, 123.0, 456.0)
    assert claimed == now


def test_a_claim_of_a_child_gone_meanwhile_leaves_it_out(local):
    rt, child = local
    kept, gone = child(), child()
    rt.registry.remove(gone.id)
    assert [r.id for r in rt.handles.mark_claimed([kept.id, gone.id], at=1.0, ends=None)] == [kept.id]


def test_a_child_is_not_put_to_sleep_while_a_request_holds_its_wake_lock(local):
    """A request holds the wake lock shared for its length: the idle loop's sleep gets it only exclusively and
    without waiting, so it gives up (the driver is never reached) and the record stays awake."""
    rt, child = local
    rec = child()
    with Flock(lockpaths.wake_lock(Path(rec.dir)), shared=True):
        assert rt.handles.of(rec).sleep() is False
    assert rt.child(rec.id).residency == "awake"


def test_a_child_is_not_put_to_sleep_under_a_branch(local):
    rt, child = local
    rec = child()
    with Flock(lockpaths.branch_lock(rt.layout.home, rec.id)):
        assert rt.handles.of(rec).sleep() is False
    assert rt.child(rec.id).residency == "awake"


class _LostVmm:
    """A driver whose VMM is gone the moment it is attached (a fault injected at the driver, not a fake of it)."""

    def attach(self, *a, **kw):
        raise OSError("the VMM is gone")


def test_a_sleep_that_fails_puts_the_residency_back(local):
    rt, child = local
    rec = child()
    rt._driver = _LostVmm()
    with pytest.raises(OSError):
        rt.handles.of(rec).sleep()
    assert rt.child(rec.id).residency == "awake"


def test_a_child_marked_asleep_by_an_earlier_forkd_counts_as_asleep(local):
    """An earlier forkd marked a sleeping child with a file of its directory: still honoured (its next request
    resumes it), and `recover` leaves it paused."""
    rt, child = local
    rec = child()
    assert not rt.handles.of(rec).asleep
    (Path(rec.dir) / lockpaths.ASLEEP_MARKER).touch()
    assert rt.handles.of(rec).asleep and rt.handles.of(rec).ensure_running() is False


def test_residency_is_shown_by_ls_the_api_view_and_metrics(local):
    rt, child = local
    awake, paged, asleep = child(), child(), child()
    rt.handles.of(paged)._residency("paged")
    rt.handles.of(asleep)._residency("asleep")
    rt.handles.of(asleep)._woke()
    rt.handles.of(asleep)._residency("asleep")
    views = {r.id: child_view(r) for r in rt.children()}
    assert {cid: (v["residency"], v["wakes"]) for cid, v in views.items()} == {
        awake.id: ("awake", 0), paged.id: ("paged", 0), asleep.id: ("asleep", 1)}
    rows = {row[0]: row[2] for row in child_rows(list(views.values()))}
    assert rows == {awake.id: "awake", paged.id: "paged", asleep.id: "asleep (woke 1)"}
    by_res, wakes = list(_residency(rt.children()))
    assert {s.labels["residency"]: s.value for s in by_res.samples} == {"awake": 1, "paged": 1, "asleep": 1}
    assert wakes.samples[0].value == 1


def test_a_branch_holds_its_source_alone_and_within_the_home_cap(local):
    """hold_for_capture: one branch of a source at a time (its branch lock), at most `max_branches` per home (the
    slots), the VMM attached (the real driver's attach: no VMM I/O); everything let go when the branch unwinds."""
    from contextlib import ExitStack

    from forkd.base.errors import Conflict

    rt, child = local
    a, b = child(), child()
    with ExitStack() as first:
        hold = rt.handles.of(a).hold_for_capture(first, max_branches=2)
        vm, lock = hold.vm, hold.lock
        assert (vm.pid, vm.started) == (a.pid, a.started) and lock.fd is not None
        with ExitStack() as again, pytest.raises(Conflict, match=f"child {a.id} is already being branched"):
            rt.handles.of(a).hold_for_capture(again, max_branches=2)
        with ExitStack() as other, pytest.raises(Conflict, match="1 branches are already in flight"):
            rt.handles.of(b).hold_for_capture(other, max_branches=1)
        assert rt.handles.of(a).sleep() is False  # the idle loop never stops a source under a branch
    with ExitStack() as later:
        rt.handles.of(a).hold_for_capture(later, max_branches=1)  # all of it was let go
