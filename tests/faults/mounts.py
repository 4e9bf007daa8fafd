"""Small filesystems the fault tests mount and fill: a loop-mounted ext4 image, a size-limited tmpfs (root only).

`fill(path, leave)` takes all the free space of path's filesystem but `leave` bytes with one file and returns it;
deleting that file is "space is freed"."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

MIB = 1 << 20


@contextlib.contextmanager
def loop_ext4(size_mib: int) -> Iterator[Path]:
    """A fresh ext4 of `size_mib` (no blocks reserved for root: root fills it like anyone) mounted at a new
    directory under /tmp; unmounted and deleted after."""
    img = Path(tempfile.mkstemp(prefix="fkfault-", suffix=".img", dir="/tmp")[1])
    mnt = Path(tempfile.mkdtemp(prefix="fkfault-mnt-", dir="/tmp"))
    try:
        os.truncate(img, size_mib * MIB)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(img)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
    finally:
        img.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()


@contextlib.contextmanager
def small_tmpfs(size_mib: int) -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="fkfault-shm-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=1777", "forkd-fault", str(mnt)],
                   check=True, capture_output=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int = 0) -> Path:
    """A file taking every free byte of path's filesystem but about `leave` (allocated for real by fallocate,
    not sparse, to within a block), so the next write that needs more fails with ENOSPC."""
    filler = path / ".fault-filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        want = max(0, free_bytes(path) - leave)
        got, step = 0, want
        while got < want and step >= 4096:  # the extent tree needs blocks too: what is refused, in halves
            step = min(step, want - got)
            try:
                os.posix_fallocate(fd, got, step)
                got += step
            except OSError:
                step //= 2
        os.fsync(fd)
    finally:
        os.close(fd)
    return filler
