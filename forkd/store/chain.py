"""Diff-snapshot chains: sparse page diffs between memory images, and flat images materialized once.

A layer stores only the 4 KiB pages whose content differs from its parent's flat image:
  diff.pages   little-endian uint32 page numbers, ascending
  diff.data    those pages' contents, 4 KiB each, in the same order
A flat image (what children map MAP_PRIVATE) is built once per content hash into the cache
(`cache/flat/<sha256>.mem`) by copying the root's memory file extent by extent (copy_file_range: in-kernel,
holes kept) and applying each layer's pages in order; its hash is verified then, and never again at spawn.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Iterator
from pathlib import Path

from forkd.base.atomic import publish, write_bytes
from forkd.base.errors import ForkdError

PAGE = 4096
CHUNK = 4 << 20
PAGES_FILE = "diff.pages"
DATA_FILE = "diff.data"
_ZERO_CHUNK = bytes(CHUNK)


class ChainError(ForkdError):
    pass


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of the allocated extents of a sparse file."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end - start
        pos = end


def _merged_extents(a: int, b: int, size: int) -> list[tuple[int, int]]:
    spans = sorted(list(data_extents(a, size)) + list(data_extents(b, size)))
    out: list[tuple[int, int]] = []
    for start, length in spans:
        start, end = start - start % CHUNK, min(size, -(-(start + length) // CHUNK) * CHUNK)
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def write_diff(parent_flat: Path, child_flat: Path, dest_dir: Path) -> tuple[int, int]:
    """Store the pages of `child_flat` that differ from `parent_flat`. Returns (pages, stored bytes)."""
    size = child_flat.stat().st_size
    if parent_flat.stat().st_size != size:
        raise ChainError(f"memory sizes differ: {parent_flat} vs {child_flat}")
    pages = array("I")
    pa, ch = os.open(parent_flat, os.O_RDONLY), os.open(child_flat, os.O_RDONLY)
    try:
        with publish(dest_dir / DATA_FILE, mode=0o600) as fd, open(fd, "wb", closefd=False) as data:
            for start, end in _merged_extents(pa, ch, size):
                for off in range(start, end, CHUNK):
                    n = min(CHUNK, end - off)
                    x, y = os.pread(pa, n, off), os.pread(ch, n, off)
                    x, y = x.ljust(n, b"\0"), y.ljust(n, b"\0")
                    if x == y:
                        continue
                    for p in range(0, n, PAGE):
                        if x[p:p + PAGE] != y[p:p + PAGE]:
                            pages.append((off + p) // PAGE)
                            data.write(y[p:p + PAGE])
    finally:
        os.close(pa)
        os.close(ch)
    write_bytes(dest_dir / PAGES_FILE, pages.tobytes(), mode=0o600)
    return len(pages), len(pages) * PAGE


def write_known_diff(parent_flat: Path, candidates: Path, dest_dir: Path) -> tuple[int, int]:
    """Store the pages of a layer-format directory `candidates` (pages a child may have changed, e.g. its private
    copies) that differ from `parent_flat`: only those pages are compared, not the whole image. Returns (pages,
    stored bytes). Page numbers must ascend and lie inside the image."""
    size = parent_flat.stat().st_size
    cand = read_pages(candidates)
    bad = next((i for i, (a, b) in enumerate(zip(cand, cand[1:], strict=False)) if b <= a), None)
    if bad is not None:
        raise ChainError(f"{candidates}: page numbers out of order: {cand[bad]} then {cand[bad + 1]} (at "
                         f"{bad + 1} of {len(cand)})")
    if cand and (cand[-1] + 1) * PAGE > size:
        raise ChainError(f"{candidates}: page {cand[-1]} is beyond the {size}-byte image")
    pages = array("I")
    pa = os.open(parent_flat, os.O_RDONLY)
    try:
        with open(candidates / DATA_FILE, "rb") as src, \
                publish(dest_dir / DATA_FILE, mode=0o600) as fd, open(fd, "wb", closefd=False) as data:
            for page in cand:
                mine = src.read(PAGE)
                if len(mine) != PAGE:
                    raise ChainError(f"{candidates}: fewer pages of data than page numbers")
                if os.pread(pa, PAGE, page * PAGE).ljust(PAGE, b"\0") != mine:
                    pages.append(page)
                    data.write(mine)
    finally:
        os.close(pa)
    write_bytes(dest_dir / PAGES_FILE, pages.tobytes(), mode=0o600)
    return len(pages), len(pages) * PAGE


def diff_hash(layer_dir: Path) -> str:
    h = hashlib.sha256()
    for name in (PAGES_FILE, DATA_FILE):
        with open(layer_dir / name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def read_pages(layer_dir: Path) -> array:
    pages = array("I")
    with open(layer_dir / PAGES_FILE, "rb") as f:
        pages.frombytes(f.read())
    return pages


def apply_diff(layer_dir: Path, fd: int) -> None:
    """Write a layer's pages into an open flat image."""
    pages = read_pages(layer_dir)
    with open(layer_dir / DATA_FILE, "rb") as data:
        for page in pages:
            os.pwrite(fd, data.read(PAGE), page * PAGE)


def copy_extents(src: Path, dst_fd: int) -> int:
    """Copy the data extents of `src` into `dst_fd` at the same offsets (holes stay holes). Returns its size."""
    size = src.stat().st_size
    os.ftruncate(dst_fd, size)
    sfd = os.open(src, os.O_RDONLY)
    try:
        for start, length in data_extents(sfd, size):
            off = start
            while off < start + length:
                try:
                    n = os.copy_file_range(sfd, dst_fd, start + length - off, off, off)
                except OSError:  # filesystems without copy_file_range across them: plain copy
                    n = os.pwrite(dst_fd, os.pread(sfd, min(CHUNK, start + length - off), off), off)
                if n <= 0:
                    raise ChainError(f"short copy from {src} at offset {off}")
                off += n
    finally:
        os.close(sfd)
    return size


def hash_image(path: Path) -> str:
    """sha256 of the logical content (holes read as zeros), the same definition as the store's memory hash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


def hash_fd(fd: int) -> str:
    """hash_image of an open file."""
    h = hashlib.sha256()
    size = os.fstat(fd).st_size
    pos = 0
    for start, length in data_extents(fd, size):
        hash_zeros(h, start - pos)
        off = start
        while off < start + length:
            chunk = os.pread(fd, min(CHUNK, start + length - off), off)
            h.update(chunk)
            off += len(chunk)
        pos = start + length
    hash_zeros(h, size - pos)
    return h.hexdigest()


def hash_zeros(h, n: int) -> None:
    while n > 0:
        k = min(n, CHUNK)
        h.update(_ZERO_CHUNK[:k])
        n -= k
