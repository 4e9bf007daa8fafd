"""A branch's source: looked up once into a frozen value (`Source`) passed to the steps, and what becomes of it
when it dies under the branch (`SourceLost`, naming the fate forkd.sandbox.child.ChildHandle.fate reads: a lost VMM,
the driver's VmmLost, is told apart by type; forkd.core.pipeline.branch_errors says what the caller sees)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.errors import Conflict
from forkd.sandbox.child import (  # noqa: F401 - the branch's names for them
    EXIT_WAIT_SECONDS,
    ChildRecord,
    SourceLost,
    vmm_lost,
)
from forkd.store.snapshot import Snapshot
from forkd.vmm.driver import Machine, RunFiles

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime



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
