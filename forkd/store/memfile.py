"""Memory-file helpers: copy a sparse file extent by extent while hashing its full logical content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from forkd.base.atomic import publish
from forkd.store.chain import CHUNK, data_extents, hash_zeros

_ZEROS = bytes(CHUNK)


def copy_sparse_hashed(src: Path, dst: Path) -> tuple[str, int, int]:
    """Copy `src` to `dst` keeping holes; return (sha256 of the logical content, logical size, stored bytes).

    Holes are hashed as zeros, so the hash is that of the whole image whatever its on-disk layout; all-zero
    chunks stay holes. `dst` appears complete and fsynced, or not at all.
    """
    h = hashlib.sha256()
    size = src.stat().st_size
    stored = 0
    sfd = os.open(src, os.O_RDONLY)
    try:
        with publish(dst, mode=0o600) as dfd:
            os.ftruncate(dfd, size)
            pos = 0
            for start, length in data_extents(sfd, size):
                hash_zeros(h, start - pos)
                for off in range(start, start + length, CHUNK):
                    data = os.pread(sfd, min(CHUNK, start + length - off), off)
                    h.update(data)
                    if data != _ZEROS[:len(data)]:
                        os.pwrite(dfd, data, off)
                        stored += len(data)
                pos = start + length
            hash_zeros(h, size - pos)
    finally:
        os.close(sfd)
    return h.hexdigest(), size, stored
