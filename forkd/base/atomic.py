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


def fsync_tree(path: Path) -> None:
    """fsync a file, or a directory's regular files (not recursively) and the directory itself."""
    path = Path(path)
    if not path.is_dir():
        fsync_file(path)
        return
    for f in path.iterdir():
        if f.is_file() and not f.is_symlink():
            fsync_file(f)
    fsync_dir(path)


def rename_into_place(src: Path, dest: Path) -> None:
    """Publish a fully written file or directory `src` as `dest`: fsync it (fsync_tree), rename, fsync the
    directory of `dest`. os.rename's rules apply: a directory replaces only an empty one (else OSError)."""
    fsync_tree(src)
    os.rename(src, dest)
    fsync_dir(Path(dest).parent)


def create_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` holding `data`, all or nothing, only if it does not exist yet (FileExistsError if it does):
    written and fsynced under a temp name, then hard-linked into place, so no reader ever sees it half written."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{threading.get_ident()}-{os.urandom(3).hex()}")
    write_bytes(tmp, data, mode)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
