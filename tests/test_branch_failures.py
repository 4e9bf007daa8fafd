"""A failed branch as its caller sees it, end to end on the fake VMM driver (tests/fake_vmm.py: ordinary processes
running the real guest agent; it meets the driver contract, tests/test_driver_contract.py): the one catcher
(BranchJob.failures -> branch_errors.branch_failure) and the source's hold (forkd.sandbox.child.CaptureHold) are
what is tested; faults are injected into the driver, below them. What a real VMM does under a failed capture is
tests/test_branch.py's and tests/test_memory_accounting.py's (QEMU)."""

from __future__ import annotations

import os
import signal

import pytest

from forkd.base.errors import Conflict, ForkdError, NotFound
from forkd.core.branch import branch
from forkd.core.pipeline.branch import BranchError, SourceLost
from forkd.core.requests import Branch, Spawn
from forkd.vmm.fake import FakeCapture, FakeDriver
from tests.conftest import BASE_TAG


@pytest.fixture
def child(fake_rt, fake_base):
    (rec,) = fake_rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    yield rec
    if rec.id in {c.id for c in fake_rt.children()}:
        fake_rt.kill([rec.id])


def _run_state(rt, rec) -> str:
    with rt.handles.get(rec.id).vmm() as vm:
        return rt.driver.run_state(vm)


def _gone(rt, rec) -> None:
    """Wait until the killed VMM shows as gone (the signal is delivered asynchronously)."""
    import time

    deadline = time.monotonic() + 30
    while rt.child(rec.id).status == "running":
        assert time.monotonic() < deadline, f"the VMM {rec.pid} did not go"
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["full", "live"])
def test_a_branch_on_the_fake_driver_leaves_the_source_running(fake_rt, child, mode):
    res = branch(fake_rt, Branch.of(child_id=child.id, tag=f"ok-{mode}", mode=mode))
    assert res.snapshot.status == "ready" and fake_rt.store.get(f"ok-{mode}").status == "ready"
    assert _run_state(fake_rt, child) == "running"


def test_a_source_killed_mid_capture_is_source_lost_naming_its_fate(fake_rt, child, monkeypatch):
    """Killed while stopped for the capture: SourceLost (409) naming the branch, the child and `dead`, the original
    failure as its cause and in its message; the snapshot is failed with the same message."""
    start = FakeCapture.start

    def killed(cap):
        cap.driver.pause(cap.vm)
        os.kill(cap.vm.pid, signal.SIGKILL)
        _gone(fake_rt, child)
        start(cap)

    monkeypatch.setattr(FakeCapture, "start", killed)
    with pytest.raises(SourceLost) as ei:
        branch(fake_rt, Branch.of(child_id=child.id, tag="lost", mode="full"))
    exc = ei.value
    assert exc.fate == "dead" and exc.http_status == 409
    assert f"branch 'lost' of child {child.id} failed: the source child is dead" in exc.message
    assert exc.__cause__ is not None and type(exc.__cause__).__name__ in exc.message
    snap = fake_rt.store.get("lost")
    assert snap.status == "failed" and "is dead" in snap.error


def test_a_capture_that_fails_under_a_running_source_propagates_and_resumes_it(fake_rt, child):
    """Another capture of the VM in flight (its lock file): the driver's CaptureError reaches the caller unchanged,
    the snapshot is failed, and the source the stop-mode capture paused runs again (the hold resumed it)."""
    lock = os.path.join(fake_rt.child(child.id).dir, "capture.lock")
    open(lock, "w").close()
    try:
        with pytest.raises(ForkdError, match="another capture .* is in flight") as ei:
            branch(fake_rt, Branch.of(child_id=child.id, tag="busy", mode="full"))
        assert not isinstance(ei.value, SourceLost)
    finally:
        if os.path.exists(lock):
            os.unlink(lock)
    assert fake_rt.store.get("busy").status == "failed"
    assert _run_state(fake_rt, child) == "running"


def test_an_unmakeable_work_directory_names_it_and_the_source_runs_on(fake_rt, child, tmp_path):
    """A tmp_dir beneath a file (ENOTDIR whoever runs it): BranchError naming the directory and what to do."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    where = blocker / "sub"
    with pytest.raises(BranchError, match=rf"cannot make the branch's work directory in {where}: Not a dir") as ei:
        branch(fake_rt, Branch.of(child_id=child.id, tag="notdir", mode="full", tmp_dir=str(where)))
    assert isinstance(ei.value.__cause__, OSError) and "writable" in ei.value.hint
    assert fake_rt.store.get("notdir").status == "failed"
    assert _run_state(fake_rt, child) == "running"


def test_a_resume_that_fails_after_the_capture_is_a_branch_error_and_the_hold_retries(fake_rt, child, monkeypatch):
    """The resume after a stop-mode capture fails once: BranchError saying so (not an internal error); the hold
    resumes the source on the way out, so it runs."""
    real, calls = FakeDriver.ensure_running, []

    def flaky(self, vm):
        calls.append(vm.pid)
        if len(calls) == 1:
            raise ForkdError("the fake VMM did not continue")
        return real(self, vm)

    monkeypatch.setattr(FakeDriver, "ensure_running", flaky)
    with pytest.raises(BranchError, match="could not resume the source after the branch: the fake VMM") as ei:
        branch(fake_rt, Branch.of(child_id=child.id, tag="stuck", mode="full"))
    assert "forkd ping" in ei.value.hint
    assert len(calls) == 2 and _run_state(fake_rt, child) == "running"
    assert fake_rt.store.get("stuck").status == "failed"


def test_a_refusal_before_the_snapshot_leaves_none(fake_rt, child):
    """A branch of a source another branch holds is refused as it was (Conflict naming the child), before any
    snapshot is begun."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        fake_rt.handles.get(child.id).hold_for_capture(stack, max_branches=4)
        with pytest.raises(Conflict, match=f"child {child.id} is already being branched") as ei:
            branch(fake_rt, Branch.of(child_id=child.id, tag="refused", mode="full"))
    assert not isinstance(ei.value, SourceLost)
    with pytest.raises(NotFound):
        fake_rt.store.get("refused")
