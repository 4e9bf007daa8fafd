"""The one inter-process lock: an exclusive flock on a lock file, held for a `with` block.

Each use opens its own descriptor, so threads of one process exclude each other as well as processes do.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path, mode: int = 0o600) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
