"""What a branch's caller sees when it fails, decided as data (forkd.core.pipeline.branch_errors.branch_failure,
pure: no VM, no driver): one row per case of failure, step and source fate."""

from __future__ import annotations

import errno

import pytest

from forkd.base.errors import Conflict, ForkdError, Timeout
from forkd.core.pipeline.branch_errors import BranchError, Case, DiffUnavailable, Outcome, branch_failure
from forkd.sandbox.child import SourceFate, SourceLost
from forkd.vmm.agent_client import AgentBusy
from forkd.vmm.driver import VmmLost

LIVE = Case(child_id="c1", tag="b1", capture="write-protect", tmp_dir="/home/x/tmp")
PAGES = Case(child_id="c1", tag="b1", capture="pages", tmp_dir="/home/x/tmp")
DIFF = Case(child_id="c1", tag="b1", capture="diff", tmp_dir="/home/x/tmp")
DEAD, OOM, REMOVED = SourceFate("dead"), SourceFate("oom-killed", 256), SourceFate("removed")
ROFS = OSError(errno.EROFS, "Read-only file system", "/ro/b-1234")

# exc, step, fate, case -> error type (None: the original unchanged), http status the caller gets, what its message
# says, what becomes of the source, of the snapshot
ROWS = [
    # refusals before the snapshot is begun stand as they were, whatever became of the source
    (Conflict("child c1 is already being branched"), "prepare", None, LIVE, None, 409, "already being branched",
     "running", "none"),
    (Conflict("4 branches are already in flight"), "prepare", DEAD, LIVE, None, 409, "in flight", "running", "none"),
    (DiffUnavailable("child c1 ... 32 layers deep"), "prepare", None, DIFF, None, 409, "layers deep", "running",
     "none"),
    # the agent held by another client: said per capture, before anything is written
    (AgentBusy("held by another connection"), "prepare", None, PAGES, Conflict, 409,
     "child c1 cannot be branched live by pages now: held by another connection", "running", "none"),
    (AgentBusy("held by another connection"), "prepare", None, DIFF, DiffUnavailable, 409,
     "child c1 cannot be branched in diff mode now: held by another connection", "running", "none"),
    # a lost VMM before the snapshot: the source's fate, and no snapshot
    (VmmLost("QMP closed"), "prepare", DEAD, LIVE, SourceLost, 409,
     "branch 'b1' of child c1 failed: the source child is dead (its VMM exited) [VmmLost: QMP closed]",
     "lost", "none"),
    # the work directory
    (ROFS, "stage", None, LIVE, BranchError, 500,
     "cannot make the branch's work directory in /home/x/tmp: Read-only file system", "running", "failed"),
    (BranchError("not enough space in /t for the branch stream"), "stage", None, LIVE, None, 500,
     "not enough space", "running", "failed"),
    # the capture itself fails while the source runs: unchanged (its kind and hint), the source resumed
    (ForkdError("capture failed: ENOSPC"), "capture", None, LIVE, None, 500, "ENOSPC", "running", "failed"),
    (Timeout("stream did not complete"), "stream", None, LIVE, None, 504, "did not complete", "running", "failed"),
    (RuntimeError("a bug"), "capture", None, LIVE, None, 500, "a bug", "running", "failed"),
    # ... or the source died under it: SourceLost naming its fate, the original in the message
    (VmmLost("QMP closed"), "capture", DEAD, LIVE, SourceLost, 409,
     "branch 'b1' of child c1 failed: the source child is dead (its VMM exited) [VmmLost: QMP closed]",
     "lost", "failed"),
    (BrokenPipeError(32, "Broken pipe"), "capture", OOM, LIVE, SourceLost, 409,
     "the source child is oom-killed (its VMM was OOM-killed at its memory limit of 256 MiB) [BrokenPipeError:",
     "lost", "failed"),
    (ForkdError("convert failed"), "convert", SourceFate("oom-killed"), LIVE, SourceLost, 409,
     "is oom-killed (its VMM was OOM-killed) [ForkdError: convert failed]", "lost", "failed"),
    (ForkdError("registry gone"), "stream", REMOVED, LIVE, SourceLost, 409,
     "the source child is removed (its record was removed)", "lost", "failed"),
    (Conflict("a conflict mid-way"), "capture", DEAD, LIVE, SourceLost, 409, "is dead", "lost", "failed"),
    # the resume after the capture
    (ForkdError("QMP cont failed"), "resume", None, LIVE, BranchError, 500,
     "could not resume the source after the branch: QMP cont failed", "running", "failed"),
    (VmmLost("QMP closed"), "resume", DEAD, LIVE, SourceLost, 409, "is dead (its VMM exited) [VmmLost",
     "lost", "failed"),
    (OSError(errno.EIO, "I/O error"), "resume", None, LIVE, None, 500, "I/O error", "running", "failed"),
]


@pytest.mark.parametrize("exc,step,fate,case,error,http,says,source,snapshot", ROWS)
def test_what_the_caller_of_a_failed_branch_sees(exc, step, fate, case, error, http, says, source, snapshot):
    out = branch_failure(exc, step, fate, case)
    assert out.error is error
    raised = out.exception() or exc
    assert getattr(raised, "http_status", 500) == http
    assert says in str(raised)
    assert (out.source, out.snapshot) == (source, snapshot)
    if error is SourceLost:
        assert raised.fate == fate.status and f"'forkd kill {case.child_id}'" in raised.hint
    if error is not None and error is not SourceLost:
        assert raised.hint  # every mapped failure says what to do


def test_an_oom_killed_source_is_told_to_come_back_with_more_memory():
    out = branch_failure(VmmLost("gone"), "capture", OOM, LIVE)
    assert "higher memory_limit_mib" in out.hint
    assert "higher memory_limit_mib" not in branch_failure(VmmLost("gone"), "capture", DEAD, LIVE).hint


def test_an_interrupt_is_never_replaced():
    for fate in (None, DEAD):
        assert branch_failure(KeyboardInterrupt(), "capture", fate, LIVE) == Outcome(None, snapshot="failed")
    assert branch_failure(KeyboardInterrupt(), "prepare", DEAD, LIVE).snapshot == "none"


def test_an_outcome_is_a_frozen_value():
    out = branch_failure(ROFS, "stage", None, LIVE)
    with pytest.raises(AttributeError):
        out.message = "x"  # type: ignore[misc]
    assert out.exception() is not out.exception()  # a new exception per raise
