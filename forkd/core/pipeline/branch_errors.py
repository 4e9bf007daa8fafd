"""What a branch's caller sees when it fails, decided as data: `branch_failure(exc, step, fate, case) -> Outcome`,
pure and table-tested (tests/test_branch_errors.py). BranchJob.failures is its one caller: it catches whatever a
step raised, reads what became of the source (forkd.sandbox.child.SourceFate, through the branch's hold on it) and
raises what the outcome says, the original failure kept as its cause.

The rules, in order:
  * a source no longer running (dead, oom-killed, removed) makes any failure `SourceLost` (409) naming the branch,
    the child, its fate and the original failure, except a refusal (a Conflict before the snapshot was begun),
    which stands as it was;
  * the source's agent held by another client when the capture wanted it: Conflict (live by pages) or
    DiffUnavailable (diff), both saying to retry once the other client is done;
  * the work directory that cannot be made (step `stage`): BranchError naming the directory to fix;
  * the source that cannot be resumed after its capture (step `resume`): BranchError saying how to check it;
  * anything else propagates unchanged (a ForkdError keeps its kind and hint; any other error is an internal one).
A failure before the snapshot was begun (step `prepare`) leaves no snapshot; any later one leaves it `failed`, its
data files dropped, with the caller's message in its manifest. The source is left running unless it is lost: a
failure once it was paused resumes it on the way out (forkd.sandbox.child.CaptureHold).
"""

from __future__ import annotations

from dataclasses import dataclass

from forkd.base.errors import Conflict, ForkdError, first_line
from forkd.sandbox.child import SourceFate, SourceLost
from forkd.vmm.agent_client import AgentBusy

PREPARE = "prepare"  # checks and holds before the snapshot is begun: a failure here leaves no snapshot
STAGE = "stage"  # the branch's work directory
RESUME = "resume"  # the source resumed after its capture


class BranchError(ForkdError):
    pass


class DiffUnavailable(Conflict):
    """A diff branch of this child cannot be made here (checked before anything is written or paused)."""


@dataclass(frozen=True)
class Case:
    """The branch a failure broke: what the caller's message names."""

    child_id: str
    tag: str
    capture: str  # the Strategy's: pages | write-protect | stop | diff
    tmp_dir: str  # where its work directory goes


@dataclass(frozen=True)
class Outcome:
    """What the caller sees: `error` (None: the original failure, unchanged) with `message` and `hint`; what
    becomes of the source (`running`, or `lost`: its fate says what `ls` shows) and of the snapshot (`none`: it was
    never begun; `failed`: kept failed with the message, its data files dropped)."""

    error: type[ForkdError] | None
    message: str | None = None
    hint: str | None = None
    source: str = "running"
    snapshot: str = "failed"
    fate: str | None = None

    def exception(self) -> ForkdError | None:
        """The exception to raise in the original's place (its cause), or None to raise the original."""
        if self.error is None:
            return None
        if self.error is SourceLost:
            return SourceLost(self.message or "", hint=self.hint, fate=self.fate or "dead")
        return self.error(self.message or "", hint=self.hint)


def branch_failure(exc: BaseException, step: str, fate: SourceFate | None, case: Case) -> Outcome:
    """What the caller of branch `case` sees when `exc` broke it in `step`, the source's `fate` read after it
    (None: it still runs)."""
    snapshot = "none" if step == PREPARE else "failed"
    if not isinstance(exc, Exception):  # an interrupt: nothing is reported in its place
        return Outcome(None, snapshot=snapshot)
    if fate is not None and not (step == PREPARE and isinstance(exc, Conflict)):
        return _lost(exc, fate, case, snapshot)
    if isinstance(exc, AgentBusy) and step == PREPARE:
        return Outcome(*_agent_busy(exc, case), snapshot=snapshot)
    if isinstance(exc, OSError) and step == STAGE:
        return Outcome(BranchError, f"cannot make the branch's work directory in {case.tmp_dir}: "
                                    f"{exc.strerror or exc}",
                       "make that directory writable by forkd (and with room for the guest's RAM), or branch into "
                       "another tmp_dir")
    if isinstance(exc, ForkdError) and step == RESUME:
        return Outcome(BranchError, f"could not resume the source after the branch: {exc.message}",
                       "check it with 'forkd ping'; 'forkd kill' it if it does not answer")
    return Outcome(None, snapshot=snapshot)


def _lost(exc: Exception, fate: SourceFate, case: Case, snapshot: str) -> Outcome:
    cid, status = case.child_id, fate.status
    why = (f"its VMM was OOM-killed at its memory limit of {fate.memory_limit_mib} MiB"
           if status == "oom-killed" and fate.memory_limit_mib
           else "its VMM was OOM-killed" if status == "oom-killed"
           else "its record was removed" if status == "removed" else "its VMM exited")
    return Outcome(SourceLost, f"branch {case.tag!r} of child {cid} failed: the source child is {status} ({why}) "
                               f"[{type(exc).__name__}: {first_line(exc)}]",
                   f"'forkd kill {cid}' removes it; fork a new child"
                   + (" with a higher memory_limit_mib" if status == "oom-killed" else ""),
                   source="lost", snapshot=snapshot, fate=status)


def _agent_busy(exc: AgentBusy, case: Case) -> tuple[type[ForkdError], str, str]:
    if case.capture != "diff":  # live by pages: taken by another client since the probe said it was free
        return (Conflict, f"child {case.child_id} cannot be branched live by pages now: {exc.message}",
                "retry once the other client is done")
    return (DiffUnavailable, f"child {case.child_id} cannot be branched in diff mode now: {exc.message}",
            "a diff branch needs the child's agent quiet while it is paused; retry once the other client is done, "
            "or branch with --mode live")
