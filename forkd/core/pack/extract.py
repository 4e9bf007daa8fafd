"""Streaming a pack into a private directory: the manifest first, then every member checked against it
(shape, kind, listed, declared size, sha256) as it is written, zero pages left as holes and every byte written
counted against the compressed bytes read (a decompression bomb stops early); a truncated archive is refused."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from forkd.base.settings import settings
from forkd.core.pack.manifest import parse_manifest
from forkd.core.pack.rules import MAX_MANIFEST_BYTES, PACK_MANIFEST, RATIO_FLOOR, PackError, Progress, safe_relpath
from forkd.core.pack.streams import CHUNK, Budget, ZstdStream
from forkd.store.chain import PAGE

_ZEROS = bytes(CHUNK)


def write_member(src: BinaryIO, dest: Path, declared: int, budget: Budget, name: str = "") -> tuple[int, str]:
    """Copy at most declared+1 bytes into a new file, zero pages left as holes, every byte written charged to
    `budget` before it is written. Returns (size, sha256)."""
    h = hashlib.sha256()
    n = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        while n <= declared:
            b = src.read(min(CHUNK, declared + 1 - n))
            if not b:
                break
            h.update(b)
            _write_sparse(fd, b, n, budget, name or dest.name)
            n += len(b)
        os.ftruncate(fd, n)
        os.fsync(fd)
    finally:
        os.close(fd)
    return n, h.hexdigest()


def _write_sparse(fd: int, b: bytes, off: int, budget: Budget, name: str) -> None:
    """Write the non-zero pages of `b` at `off` (zeros stay holes)."""
    if b == _ZEROS[:len(b)]:
        return
    for p in range(0, len(b), PAGE):
        page = b[p:p + PAGE]
        if page != _ZEROS[:len(page)]:
            budget.charge(len(page), name)
            os.pwrite(fd, page, off + p)


def extract(fh: BinaryIO, stage: Path, progress: Progress, owned: bool = False) -> dict:
    """Stream the pack into `stage`, checking every member; return the manifest, with `_sha256` the pack file's."""
    stream = ZstdStream(fh)
    budget = Budget(stream.raw, settings().pack_max_ratio, RATIO_FLOOR)
    try:
        # read in tar records: a pack's tar stream is a whole number of them, so a short read means truncation
        tar = tarfile.open(fileobj=stream, mode="r|", bufsize=tarfile.RECORDSIZE)
    except tarfile.TarError as exc:
        raise PackError(f"not a forkd pack (tar): {exc}") from None
    manifest: dict | None = None
    done: set[str] = set()
    try:
        for info in tar:
            if manifest is None:
                manifest = _read_manifest(tar, info, owned)
            elif _stage_member(tar, info, manifest["_members"], stage, done, budget):
                progress(f"verified {info.name}")
    except tarfile.TarError as exc:
        raise PackError(f"the pack is truncated or corrupt: {exc}") from None
    except EOFError as exc:
        raise PackError(f"the pack is truncated: {exc}") from None
    if stream.hit_eof:
        raise PackError("the pack is truncated: its data ended before the end-of-archive marker")
    if manifest is None:
        raise PackError("the pack is empty")
    missing = sorted(set(manifest["_members"]) - done)
    if missing:
        raise PackError(f"the pack is missing {len(missing)} listed members (first: {missing[0]}): "
                        "truncated or incomplete")
    manifest["_sha256"] = stream.raw.digest_all()
    return manifest


def _read_manifest(tar: tarfile.TarFile, info: tarfile.TarInfo, owned: bool) -> dict:
    """The pack's first member, which must be its manifest."""
    if info.name != PACK_MANIFEST or not info.isreg():
        raise PackError(f"the first member of a pack must be {PACK_MANIFEST} (found {info.name!r})")
    if info.size > MAX_MANIFEST_BYTES:
        raise PackError(f"{PACK_MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
    f = tar.extractfile(info)
    return parse_manifest(f.read(MAX_MANIFEST_BYTES + 1) if f else b"", owned)


def _stage_member(tar: tarfile.TarFile, info: tarfile.TarInfo, entries: dict, stage: Path, done: set[str],
                  budget: Budget) -> bool:
    """Check one member against the manifest's `entries` and write it under `stage` (its size and sha256 checked
    as it streams); add it to `done`. False for a directory: checked, nothing written."""
    name = info.name
    path = safe_relpath(name)
    if not (info.isdir() or info.isreg()):
        what = ("symlink" if info.issym() else "hard link" if info.islnk() else
                "device file" if info.ischr() or info.isblk() else "special file")
        raise PackError(f"pack member {name!r} is a {what}: packs may hold only regular files")
    if info.isdir():
        ok = {str(PurePosixPath(*p.split("/")[:k])) for p in entries for k in (1, 2)}
        if str(path) not in ok:
            raise PackError(f"pack member {name!r} (a directory) is not part of the manifest")
        return False
    key = str(path)
    if key not in entries:
        raise PackError(f"pack member {name!r} is not listed in the pack manifest: refused")
    if key in done:
        raise PackError(f"pack member {name!r} appears twice")
    declared = entries[key]["size"]
    if info.size > declared:
        raise PackError(f"pack member {name!r} is larger than declared ({info.size} > {declared} bytes)")
    dest = stage / path
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(info)
    if src is None:
        raise PackError(f"pack member {name!r} cannot be read")
    got, digest = write_member(src, dest, declared, budget, name)
    if got > declared:
        raise PackError(f"pack member {name!r} is larger than declared ({declared} bytes)")
    if got != declared:
        raise PackError(f"pack member {name!r} is shorter than declared ({got} < {declared} bytes): "
                        "the pack is truncated")
    if digest != entries[key]["sha256"]:
        raise PackError(f"pack member {name!r} does not match its sha256 in the manifest "
                        f"({digest[:12]} != {entries[key]['sha256'][:12]}): the pack is corrupt")
    done.add(key)
    return True
