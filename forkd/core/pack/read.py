"""Reading a pack: `unpack` verifies it completely in a private directory under $FORKD_HOME/tmp, decides every
conflict, then moves each image into place with one rename and installs each snapshot through the store
(`SnapshotStore.install`: the store is the only place a snapshot comes into being); `read_manifest` reads the
manifest only."""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.atomic import rename_into_place
from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.owners import owned_name
from forkd.core.pack.extract import extract
from forkd.core.pack.manifest import parse_manifest
from forkd.core.pack.rules import (
    MAX_MANIFEST_BYTES,
    OWNED_PREFIX,
    PACK_MANIFEST,
    PULLED_AT_LABEL,
    SOURCE_LABEL,
    PackError,
    Progress,
    quiet,
)
from forkd.core.pack.staged import check_staged, same_image, same_snapshot
from forkd.core.pack.streams import ZstdStream
from forkd.image.build import Image
from forkd.store.snapshot import Snapshot

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime


def _plan(rt: Runtime, stage: Path, m: dict, snaps: list[Snapshot],
          images: list[Image]) -> tuple[list[tuple[Path, Path, str]], list[str]]:
    """(moves (staged dir, target, label), labels already in place): a Conflict before anything is moved."""
    layout = rt.layout
    plan: list[tuple[Path, Path, str]] = []
    skipped: list[str] = []
    for img in images:
        target = layout.images / img.id
        if target.exists():
            if not same_image(target, m, img.id):
                raise Conflict(f"guest image {img.id!r} already exists with different content",
                               hint=f"inspect {target}; the pack's image differs from it")
            skipped.append(f"images/{img.id}")
        else:
            plan.append((stage / "images" / img.id, target, f"images/{img.id}"))
    for s in snaps:
        target = rt.store.dir(s.tag)
        if target.exists():
            try:
                existing = rt.store.get(s.tag)
            except (ForkdError, OSError):
                existing = None
            if existing is None or not same_snapshot(existing, s):
                raise Conflict(f"snapshot {s.tag!r} already exists with different content",
                               hint=f"delete it with 'forkd snapshot rm {s.tag}' or unpack into another FORKD_HOME")
            skipped.append(s.tag)
        else:
            plan.append((stage / "snapshots" / s.tag, target, s.tag))
    return plan, skipped


def _provenance(s: Snapshot, source: str, owned: bool) -> Snapshot:
    """The record as installed: labels forkd sets itself (owner, spec hash ...) are never taken from a pack unless
    it is `owned` (its digest pinned by a caller that trusts its builder, e.g. the operator distributing a parent
    one of its nodes built); forkd.dev/source says where the snapshot came from."""
    labels = {k: v for k, v in s.labels.items() if owned or not k.startswith(OWNED_PREFIX)}
    if owned:  # the reconciler keeps it a while although its object is not applied yet
        labels[PULLED_AT_LABEL] = f"{time.time():.0f}"
    return s.with_(labels={**labels, SOURCE_LABEL: source})


def _install(rt: Runtime, plan: list[tuple[Path, Path, str]], snaps: dict[str, Snapshot], source: str,
             owned: bool, progress: Progress) -> list[str]:
    installed = []
    for src, target, label in plan:  # images first, then the chain root to head: never a head alone
        if label in snaps:  # a snapshot: the store brings it into being (record, modes, fsync, rename)
            rt.store.install(src, _provenance(snaps[label], source, owned))
        else:
            _install_image(src, target, label)
        installed.append(label)
        progress(f"installed {label}")
    return installed


def _install_image(src: Path, target: Path, label: str) -> None:
    for f in src.iterdir():
        os.chmod(f, 0o444)
    os.chmod(src, 0o755)
    try:
        rename_into_place(src, target)
    except OSError as exc:
        if target.exists():
            raise Conflict(f"{label} appeared while unpacking; run the unpack again") from exc
        raise


def unpack(rt: Runtime, path: Path, progress: Progress = quiet, owned: bool = False,
           source: str | None = None) -> dict:
    """Verify a pack completely in a private directory, then move each image into place and install each
    snapshot through the store (labelled forkd.dev/source: `source`, default pack:<sha256 of the pack file>).
    `owned`: the caller pinned this pack's digest to a build it trusts; its tags and labels the reconciler owns are
    kept (forkd.core.pack.oci)."""
    t0 = time.perf_counter()
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"{path} is not a file")
    stage = rt.layout.tmp / owned_name("unpack")
    stage.mkdir(mode=0o700)
    try:
        with open(path, "rb") as fh:
            m = extract(fh, stage, progress, owned)
        snaps, images = check_staged(stage, m)
        # decide everything before moving anything: conflicts are refused with nothing installed
        plan, skipped = _plan(rt, stage, m, snaps, images)
        source = source or f"pack:{m['_sha256']}"
        installed = _install(rt, plan, {s.tag: s for s in snaps}, source, owned, progress)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {"head": m["head"], "chain": m["chain"], "image_id": m["image_id"], "installed": installed,
            "skipped": skipped, "members": len(m["_members"]), "source": source,
            "logical_bytes": sum(e["size"] for e in m["_members"].values()),
            "seconds": round(time.perf_counter() - t0, 3)}


def read_manifest(path: Path) -> dict:
    """The manifest of a pack (the first member only; nothing is verified beyond its own rules)."""
    with open(path, "rb") as fh:
        stream = ZstdStream(fh)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                info = tar.next()
                if info is None or info.name != PACK_MANIFEST or not info.isreg() or info.size > MAX_MANIFEST_BYTES:
                    raise PackError(f"the first member of a pack must be {PACK_MANIFEST}")
                f = tar.extractfile(info)
                m = parse_manifest(f.read() if f else b"")
        except tarfile.TarError as exc:
            raise PackError(f"not a forkd pack: {exc}") from None
    m.pop("_members", None)
    return m
