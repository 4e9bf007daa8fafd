"""Every lock a child is guarded by, named in one place: who takes each, and how.

  * the registry lock (`registry_lock`, in the children directory): record changes that must not interleave
    (claims, retirements, a child's residency), held briefly;
  * a child's wake lock (`wake_lock`, in its own directory): shared by every request while it runs, taken
    exclusively (without waiting) by the idle loop while it puts the child to sleep;
  * a child's branch lock (`branch_lock`, in the home's private lock directory): one branch of a source at a
    time; the idle loop's sleep needs it too, so a child is never stopped under a branch;
  * the branch slots (`branch_slot`, same directory): at most FORKD_MAX_BRANCHES branches per home, across
    processes (a killed process frees its slot).

Every lock file is opened O_NOFOLLOW (forkd.base.locks); the lock directory is made 0700 and refused when it is a
symbolic link (forkd.base.private)."""

from __future__ import annotations

from pathlib import Path

from forkd.base.private import ensure_private_dir

LOCK_DIR = "locks"  # in $FORKD_HOME: branch locks and slots
REGISTRY_LOCK = ".lock"  # in the children directory
WAKE_LOCK = "wake.lock"  # in a child's directory
ASLEEP_MARKER = "asleep"  # in a child's directory: how an earlier forkd marked a sleeping child (still honoured)


def lock_dir(home: Path) -> Path:
    """The home's private lock directory (made here, 0700, if missing)."""
    return ensure_private_dir(Path(home) / LOCK_DIR)


def registry_lock(children_root: Path) -> Path:
    return Path(children_root) / REGISTRY_LOCK


def wake_lock(child_dir: Path) -> Path:
    return Path(child_dir) / WAKE_LOCK


def branch_lock(home: Path, child_id: str) -> Path:
    """The lock a branch of `child_id` holds while it involves the source (the idle loop's sleep needs it too)."""
    return lock_dir(home) / f"branch-child-{child_id}.lock"


def branch_slot(home: Path, i: int) -> Path:
    return lock_dir(home) / f"branch-slot-{i}.lock"
