"""The one inter-process lock: an exclusive flock on a lock file.

`file_lock(path)` blocks until the lock is held, for a `with` block. `try_lock(path)` does not wait: it returns
a held Flock or None. A Flock is released by `release()` (idempotent), at the end of a `with` block, or when the
process dies. Each lock opens its own descriptor, so threads of one process exclude each other as well as
processes do.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class Flock:
    """An exclusive flock on `path`, held from construction until release()."""

    def __init__(self, path: Path, mode: int = 0o600, blocking: bool = True):
        self.path = Path(path)
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BaseException:
            os.close(self.fd)
            self.fd = None
            raise

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
