"""Crash-safe file writes: write a temp file in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Atomic replace. `durable=False` skips the fsyncs: the file is still never torn (rename), but a power loss
    may bring back the previous version; right for state that a power loss makes moot anyway."""
    path = Path(path)
    # unique per writer (process, thread, call): concurrent writers of one file must not share a temp file
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}-{os.urandom(3).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if durable:
            os.chmod(tmp, mode)  # exact mode whatever the umask (fast path: the umask can only remove bits)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json(path: Path, obj: Any, mode: int = 0o644, durable: bool = True) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) if durable else json.dumps(obj, separators=(",", ":"))
    write_bytes(path, (text + "\n").encode(), mode, durable)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
