"""The one inter-process lock: an exclusive (or shared) flock on a lock file.

`file_lock(path)` blocks until the lock is held, for a `with` block. `try_lock(path)` does not wait: it returns
a held Flock or None. A Flock is released by `release()` (idempotent), at the end of a `with` block, or when the
process dies. Each lock opens its own descriptor, so threads of one process exclude each other as well as
processes do.

A lock held for a process's lifetime (the daemon's, on its FORKD_HOME) says who holds it: the holder calls
`Flock.note(text)` (e.g. its pid), a process refused the lock reads it with `holder_note(path)`.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class Flock:
    """An exclusive flock on `path` (`shared`: a shared one, which only excludes exclusive holders), held from
    construction until release()."""

    def __init__(self, path: Path, mode: int = 0o600, blocking: bool = True, shared: bool = False):
        self.path = Path(path)
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
        except BaseException:
            os.close(self.fd)
            self.fd = None
            raise

    def note(self, text: str) -> None:
        """Replace the lock file's content by `text` (who holds it); read by `holder_note`."""
        assert self.fd is not None, "note() on a released lock"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Flock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def file_lock(path: Path, mode: int = 0o600) -> Flock:
    """Wait for the lock on `path`; use it as `with file_lock(path): ...`."""
    return Flock(path, mode)


def try_lock(path: Path, mode: int = 0o600) -> Flock | None:
    """The lock on `path` if nobody holds it, else None (never waits)."""
    try:
        return Flock(path, mode, blocking=False)
    except BlockingIOError:
        return None


def holder_note(path: Path, limit: int = 256) -> str:
    """What the holder of the lock on `path` wrote with `Flock.note` ('' when nothing, or no such file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, limit).decode(errors="replace").strip()
    finally:
        os.close(fd)
