"""Writing a pack: every file of a chain and its guest image(s) is hashed and listed in the manifest, then
streamed into a .tar.zst beside `out` that replaces it only when complete (noted in the home's tmp/, so a writer
killed mid-way leaves nothing gc cannot find: forkd.base.outside)."""

from __future__ import annotations

import contextlib
import errno
import json
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import zstandard

from forkd.base.errors import Conflict, ForkdError, NotFound, Unavailable
from forkd.base.names import check_tag
from forkd.base.outside import publish_outside
from forkd.base.space import free_bytes
from forkd.core.pack.disks import disk_problem, file_hash
from forkd.core.pack.manifest import build_manifest
from forkd.core.pack.rules import (
    BASE_FILES,
    IMAGE_DISK,
    IMAGE_FILES,
    LAYER_FILES,
    PACK_MANIFEST,
    Progress,
    check_unowned_tag,
    quiet,
)
from forkd.core.pack.streams import CHUNK, BytesReader, HashingReader
from forkd.store import chain as chainmod
from forkd.store.snapshot import DISK, MEMORY, Snapshot

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime


def _members(rt: Runtime, snaps: list[Snapshot], image_ids: list[str]) -> list[tuple[str, Path]]:
    """(path in the pack, file on disk) of every member after the manifest, in pack order."""
    members: list[tuple[str, Path]] = []
    for s in snaps:
        d = rt.store.dir(s.tag)
        for name in (LAYER_FILES if s.is_layer else BASE_FILES) + ((DISK,) if s.has_disk else ()):
            members.append((f"snapshots/{s.tag}/{name}", d / name))
    for image_id in image_ids:
        image = rt.image(image_id)
        for name in IMAGE_FILES + ((IMAGE_DISK,) if image.disk is not None else ()):
            members.append((f"images/{image_id}/{name}", image.dir / name))
    return members


def _listed(tag: str, members: list[tuple[str, Path]]) -> list[dict]:
    """The manifest's member entries: path, size, sha256 and mode of each file."""
    listed = []
    for arc, p in members:
        if not p.is_file() or p.is_symlink():
            raise ForkdError(f"{p} is missing or not a regular file; cannot pack {tag!r}")
        digest = file_hash(p)
        listed.append({"path": arc, "size": p.stat().st_size, "sha256": digest, "mode": 0o444})
    return listed


def _check_unchanged(rt: Runtime, snaps: list[Snapshot], image_ids: list[str], listed: list[dict]) -> None:
    by = {m["path"]: m["sha256"] for m in listed}
    for s in snaps:  # refuse to pack what no longer matches its own manifest
        if not s.is_layer and by[f"snapshots/{s.tag}/{MEMORY}"] != s.memory_sha256:
            raise ForkdError(f"snapshot {s.tag!r}: its memory file no longer matches its recorded hash",
                             hint=f"delete it with 'forkd snapshot rm --force {s.tag}' and create it again")
        if s.is_layer and chainmod.diff_hash(rt.store.dir(s.tag)) != s.diff_sha256:
            raise ForkdError(f"snapshot {s.tag!r}: its diff files no longer match their recorded hash",
                             hint=f"delete it with 'forkd snapshot rm --force --cascade {s.tag}' and rebuild")
    # disks: each matches its recorded hash and names its backing file relatively, as the unpacking side demands
    problem = disk_problem(snaps, {i: rt.image(i).meta for i in image_ids}, by, rt.store.dir)
    if problem:
        raise ForkdError(f"cannot pack {snaps[-1].tag!r}: {problem}",
                         hint="delete what no longer matches with 'forkd snapshot rm --force' and build it again")


def _write(out: Path, tmp_dir: Path, raw: bytes, members: list[tuple[str, Path]], listed: list[dict],
           progress: Progress, level: int) -> None:
    """The manifest `raw`, then every member, as a .tar.zst in a temp file renamed to `out` when complete."""
    with publish_outside(out, tmp_dir) as tmp, open(tmp, "xb") as fh:
        cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=-1)
        with cctx.stream_writer(fh, closefd=False) as zw:
            with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
                now = int(time.time())
                info = tarfile.TarInfo(PACK_MANIFEST)
                info.size, info.mode, info.mtime = len(raw), 0o444, now
                tar.addfile(info, BytesReader(raw))
                for (arc, p), m in zip(members, listed, strict=True):
                    progress(f"adding {arc} ({m['size']} bytes)")
                    info = tarfile.TarInfo(arc)
                    info.size, info.mode, info.mtime = m["size"], 0o444, now
                    with open(p, "rb") as f:
                        r = HashingReader(f)
                        tar.addfile(info, r)
                    if r.h.hexdigest() != m["sha256"]:
                        raise ForkdError(f"{p} changed while it was being packed")


def _deleted_meanwhile(rt: Runtime, snaps: list[Snapshot], out: Path, exc: Exception) -> None:
    """A snapshot of the chain deleted while it was packed (`rmi` does not wait for readers) is NotFound, by name."""
    for s in snaps:
        try:
            rt.store.get(s.tag)
        except NotFound:
            raise NotFound(f"snapshot {s.tag!r} was deleted while it was being packed ({exc})",
                           hint=f"nothing was written to {out}; pack a snapshot that exists") from exc


def _no_room(tag: str, out: Path, notes: Path) -> Unavailable:
    """The pack's output filesystem (or, when it has more room, the home's, where its note goes) is full."""
    where = out.parent
    with contextlib.suppress(OSError):
        if free_bytes(notes) < free_bytes(out.parent):
            where = notes
    return Unavailable(f"no space left on the filesystem of {where} while writing the pack of {tag!r}; {out} keeps "
                       "what it held and no temporary is left", hint="free space there, or write the pack to another "
                                                                     "filesystem (--output-file)")


def pack(rt: Runtime, tag: str, out: Path, progress: Progress = quiet, level: int = 3, owned: bool = False) -> dict:
    """Write the chain of `tag` (every ancestor, root first) and its guest image to `out` (.tar.zst). `owned`:
    tags the reconciler owns may be packed (for a puller that pins the digest: forkd.core.pack.oci)."""
    t0 = time.perf_counter()
    check_tag(tag)
    snaps = rt.store.ancestors(tag)  # every link present, ready, and holding the content its child was built on
    for s in snaps:
        if not owned:
            check_unowned_tag(s.tag)  # no one could unpack it: say so now, with the way out
        if s.status != "ready":
            raise Conflict(f"snapshot {s.tag!r} is {s.status}: only ready snapshots can be packed")
    image_ids = list(dict.fromkeys(s.image_id for s in snaps))
    out = Path(out).absolute()
    try:
        members = _members(rt, snaps, image_ids)
        progress(f"hashing {len(members)} files of {len(snaps)} snapshots")
        listed = _listed(tag, members)
        _check_unchanged(rt, snaps, image_ids, listed)
        manifest = build_manifest(tag, snaps, image_ids, listed)
        raw = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        _write(out, rt.layout.tmp, raw, members, listed, progress, level)
    except (FileNotFoundError, ForkdError) as exc:  # a file gone, or found missing by the checks
        _deleted_meanwhile(rt, snaps, out, exc)
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_room(tag, out, rt.layout.tmp) from exc
        raise
    return {"tag": tag, "chain": manifest["chain"], "image_id": manifest["image_id"], "path": str(out),
            "members": len(listed), "logical_bytes": sum(m["size"] for m in listed),
            "pack_bytes": out.stat().st_size, "seconds": round(time.perf_counter() - t0, 3),
            "manifest": {k: manifest[k] for k in ("head", "chain", "image_id", "images", "forkd_version")}}
