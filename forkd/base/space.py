"""Room on a filesystem before forkd writes a large file there (guest RAM on tmpfs: a parent's or layer's scratch
memory, a flat image): an error that says what needs how much where and how to make room, instead of ENOSPC half
way through, or a SIGBUS that kills a VMM whose guest touched a page of a full tmpfs.

The check is made once, before the write: builds started at the same moment may each find room that only one of
them gets (they then fail with ENOSPC, or their VMM with SIGBUS, as before)."""

from __future__ import annotations

import os
from pathlib import Path

from forkd.base.errors import Unavailable

MIB = 1 << 20


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still take on the filesystem of `directory`."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def require_room(directory: Path, need_bytes: int, what: str) -> None:
    """Unavailable naming `what`, the sizes and `directory` when its filesystem has less than `need_bytes` free."""
    st = os.statvfs(directory)
    free = free_bytes(directory)
    if st.f_blocks and free < need_bytes:  # f_blocks 0: no size limit (ramfs, tmpfs size=0): not checked
        raise Unavailable(f"{what} needs {need_bytes / MIB:.0f} MiB in {directory}, whose filesystem has "
                          f"{free / MIB:.0f} MiB free",
                          hint="make room: delete snapshots nothing uses ('forkd snapshot rm TAG'; 'forkd gc' removes "
                               "flat images no snapshot needs), or set FORKD_SHM to a larger tmpfs")
