"""Crash-safe file writes: write a temp file in the same directory, fsync, rename, fsync the directory.

`publish(path)` is the one sequence (temp file beside `path` -> write by descriptor -> fsync -> mode -> rename ->
fsync the directory; the temp file is removed on failure); `write_bytes` / `write_json` use it for whole
contents, and callers that copy extents or stream into a descriptor use it directly. `sync_file` makes a file
written by someone else (a VMM, a tool) durable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from forkd.base.owners import owned_name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(path: Path) -> os.stat_result:
    """fsync a file written by another process (a VMM, qemu-img); returns its stat (st_blocks: bytes stored)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return os.fstat(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """A temp file name beside `path`, unique per writer (process, thread, call): concurrent writers of one file
    must not share a temp file."""
    return path.with_name(owned_name(f".{path.name}.tmp"))  # owned (forkd.base.owners): gc removes a dead one's


@contextmanager
def publish(path: Path, mode: int = 0o644, durable: bool = True) -> Iterator[int]:
    """Yield a descriptor (read-write) of a new temp file beside `path`; on success it is fsynced, given exactly
    `mode` and renamed over `path` (then the directory is fsynced); on failure it is removed. `durable=False`
    skips the fsyncs: the file is still never torn (rename), but a power loss may bring back the old version."""
    path = Path(path)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            yield fd
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if durable:
            os.chmod(tmp, mode)  # exact mode whatever the umask (fast path: the umask can only remove bits)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_bytes(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Atomic replace of `path` by `data` (see publish)."""
    with publish(path, mode, durable) as fd:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def write_json(path: Path, obj: Any, mode: int = 0o644, durable: bool = True) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) if durable else json.dumps(obj, separators=(",", ":"))
    write_bytes(path, (text + "\n").encode(), mode, durable)


def fsync_tree(path: Path) -> None:
    """fsync a file, or a directory's regular files (not recursively) and the directory itself."""
    path = Path(path)
    if not path.is_dir():
        sync_file(path)
        return
    for f in path.iterdir():
        if f.is_file() and not f.is_symlink():
            sync_file(f)
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
    tmp = path.with_name(owned_name(f".{path.name}.new"))
    write_bytes(tmp, data, mode)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
