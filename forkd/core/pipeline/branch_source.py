"""A branch's source: looked up once into a frozen value (`Source`) passed to the steps, and what becomes of it
when it dies under the branch (`SourceLost`: a lost VMM, the driver's VmmLost, is told apart by type)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.errors import Conflict
from forkd.sandbox.child import ChildRecord
from forkd.store.snapshot import Snapshot
from forkd.vmm.driver import Machine, RunFiles, VmmLost

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

EXIT_WAIT_SECONDS = 5.0  # a VMM whose sockets broke is exiting: how long to wait for it to be gone


class SourceLost(Conflict):
    """The source child died (or was removed) while it was being branched; `fate` is what `ls` shows for it."""

    def __init__(self, message: str, hint: str | None = None, *, fate: str = "dead", **kw):
        super().__init__(message, hint, **kw)
        self.fate = fate


@dataclass(frozen=True)
class Source:
    """A branch's source, looked up once before anything else: its record, its snapshot (machine and image
    description), the machine it runs and its run files."""

    rec: ChildRecord
    snapshot: Snapshot
    machine: Machine
    files: RunFiles


def source_of(rt: Runtime, child_id: str) -> Source:
    """The running child `child_id` as a branch's source; Conflict if it is not running."""
    rec = rt.registry.get(child_id)
    if rec.status != "running":
        raise Conflict(f"child {child_id} is {rec.status}, not running", hint="only running children can be branched")
    snap = rt.store.get(rec.snapshot)
    return Source(rec, snap, rt.machine_for(snap), RunFiles(Path(rec.dir)))


def vmm_lost(exc: BaseException | None) -> bool:
    """True if `exc` or anything in its chain says a VMM's socket broke (the driver's VmmLost, or the OS's)."""
    for _ in range(16):
        if exc is None:
            return False
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, VmmLost)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
