"""Memory-file helpers: copy a sparse file extent by extent while hashing its full logical content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 4 << 20
_ZEROS = bytes(CHUNK)


def _extents(fd: int, size: int):
    """(offset, length) of the data extents of a sparse file."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after pos
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end - start
        pos = end


def copy_sparse_hashed(src: Path, dst: Path) -> tuple[str, int, int]:
    """Copy `src` to `dst` keeping holes; return (sha256 of the logical content, logical size, stored bytes).

    Holes are hashed as zeros, so the hash is that of the whole image whatever its on-disk layout.
    """
    h = hashlib.sha256()
    size = src.stat().st_size
    sfd = os.open(src, os.O_RDONLY)
    dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    stored = 0
    try:
        os.ftruncate(dfd, size)
        pos = 0
        for start, length in _extents(sfd, size):
            _hash_zeros(h, start - pos)
            off = start
            while off < start + length:
                n = min(CHUNK, start + length - off)
                data = os.pread(sfd, n, off)
                h.update(data)
                if data != _ZEROS[:n]:  # all-zero chunks stay holes
                    os.pwrite(dfd, data, off)
                    stored += len(data)
                off += n
            pos = start + length
        _hash_zeros(h, size - pos)
        os.fsync(dfd)
    finally:
        os.close(sfd)
        os.close(dfd)
    return h.hexdigest(), size, stored


def _hash_zeros(h, n: int) -> None:
    while n > 0:
        k = min(n, CHUNK)
        h.update(_ZEROS[:k])
        n -= k
