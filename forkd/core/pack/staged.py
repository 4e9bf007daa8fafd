"""Checks on unpacked content: the staged snapshots and images against each other and the manifest, and
whether a snapshot or image already in place holds the same content as the pack's."""

from __future__ import annotations

import json
from pathlib import Path

from forkd.core.pack.disks import disk_problem, file_hash
from forkd.core.pack.rules import IMAGE_DISK, PackError
from forkd.image.build import Image
from forkd.store import chain as chainmod
from forkd.store.snapshot import MANIFEST, MEMORY, VMSTATE, CorruptManifest, Snapshot


def check_staged(stage: Path, m: dict) -> tuple[list[Snapshot], list[Image]]:
    """Cross-check the staged snapshots and images: manifests, parents, hashes, image."""
    entries = m["_members"]
    images = []
    for image_id in m["images"]:
        d = stage / "images" / image_id
        try:
            meta = json.loads((d / "image.json").read_text())
            img = Image(meta["id"], d, d / "vmlinuz", d / "initrd.img", meta["kernel_sha256"], meta)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PackError(f"pack image {image_id!r}: image.json is invalid ({exc})") from None
        if img.id != image_id:
            raise PackError(f"pack image {image_id!r}: image.json names id {img.id!r}")
        if img.kernel_sha256 != entries[f"images/{image_id}/vmlinuz"]["sha256"]:
            raise PackError(f"pack image {image_id!r}: the kernel does not match image.json's kernel_sha256")
        if meta.get("initrd_sha256") not in (None, entries[f"images/{image_id}/initrd.img"]["sha256"]):
            raise PackError(f"pack image {image_id!r}: the initramfs does not match image.json's initrd_sha256")
        images.append(img)
    kernels = {i.id: i.kernel_sha256 for i in images}
    snaps: list[Snapshot] = []
    for i, tag in enumerate(m["chain"]):
        d = stage / "snapshots" / tag
        try:
            s = Snapshot.from_file(d / MANIFEST)
        except CorruptManifest as exc:
            raise PackError(f"pack snapshot {tag!r}: {exc.message}") from None
        if s.tag != tag:
            raise PackError(f"pack snapshot {tag!r}: its manifest names tag {s.tag!r}")
        if s.status != "ready":
            raise PackError(f"pack snapshot {tag!r} is {s.status}, not ready")
        if s.image_id not in kernels or s.kernel_sha256 != kernels[s.image_id]:
            raise PackError(f"pack snapshot {tag!r} needs image {s.image_id!r}, which the pack does not hold")
        if entries[f"snapshots/{tag}/{VMSTATE}"]["sha256"] != s.vmstate_sha256:
            raise PackError(f"pack snapshot {tag!r}: vmstate does not match its recorded hash")
        if i == 0:
            if s.is_layer:
                raise PackError(f"pack snapshot {tag!r} is the chain root but is a layer of {s.parent_tag!r}")
            if entries[f"snapshots/{tag}/{MEMORY}"]["sha256"] != s.memory_sha256:
                raise PackError(f"pack snapshot {tag!r}: memory.bin does not match its recorded content hash")
        else:
            parent = snaps[-1]
            if s.parent_tag != parent.tag or s.parent_content_hash != parent.memory_sha256:
                raise PackError(f"pack snapshot {tag!r} is not built on {parent.tag!r} as the chain says")
            if chainmod.diff_hash(d) != s.diff_sha256:
                raise PackError(f"pack snapshot {tag!r}: its diff files do not match their recorded hash")
            _check_diff(d, s, entries, snaps[0])
        _check_memory(s, entries, snaps[0] if snaps else s)
        snaps.append(s)
    problem = disk_problem(snaps, {i.id: i.meta for i in images}, {p: e["sha256"] for p, e in entries.items()},
                           lambda tag: stage / "snapshots" / tag)
    if problem:
        raise PackError(f"pack {problem}")
    return snaps, images


def _check_memory(s: Snapshot, entries: dict, root: Snapshot) -> None:
    """The memory size a snapshot records fits its RAM, and every link of a chain has the root's RAM."""
    size = entries[f"snapshots/{root.tag}/{MEMORY}"]["size"]
    if size > s.memory_mib << 20 or s.memory_mib != root.memory_mib or s.memory_bytes not in (0, size):
        raise PackError(f"pack snapshot {s.tag!r}: its memory ({s.memory_mib} MiB, {s.memory_bytes} bytes) does "
                        f"not match the chain's memory file ({size} bytes, {root.memory_mib} MiB)")


def _check_diff(d: Path, s: Snapshot, entries: dict, root: Snapshot) -> None:
    """A layer's diff: page numbers ascending, each inside the chain's memory, as many as recorded, with one
    page of data each (a page number past the memory would make a huge flat image when materialized)."""
    pages_size = entries[f"snapshots/{s.tag}/{chainmod.PAGES_FILE}"]["size"]
    data_size = entries[f"snapshots/{s.tag}/{chainmod.DATA_FILE}"]["size"]
    limit = entries[f"snapshots/{root.tag}/{MEMORY}"]["size"] // chainmod.PAGE
    n = pages_size // 4
    if pages_size % 4 or n > limit or n != s.diff_pages or data_size != n * chainmod.PAGE:
        raise PackError(f"pack snapshot {s.tag!r}: its diff holds {pages_size} bytes of page numbers and "
                        f"{data_size} of data for {s.diff_pages} recorded pages of a {limit}-page memory")
    pages = chainmod.read_pages(d)
    if any(b <= a for a, b in zip(pages, pages[1:], strict=False)) or (n and pages[-1] >= limit):
        raise PackError(f"pack snapshot {s.tag!r}: its diff page numbers are not ascending pages of its "
                        f"{limit}-page memory (last: {pages[-1] if n else None})")


def same_image(target: Path, m: dict, image_id: str) -> bool:
    """Whether the image in place holds the pack's files, each with the same content (and no root disk the
    pack's image lacks)."""
    listed = {p.rsplit("/", 1)[1]: e["sha256"] for p, e in m["_members"].items() if p.startswith(f"images/{image_id}/")}
    if IMAGE_DISK not in listed and (target / IMAGE_DISK).exists():
        return False
    try:
        return all(file_hash(target / name) == digest for name, digest in listed.items())
    except OSError:
        return False


def same_snapshot(existing: Snapshot, s: Snapshot) -> bool:
    return (existing.status == "ready" and existing.memory_sha256 == s.memory_sha256
            and existing.vmstate_sha256 == s.vmstate_sha256 and existing.parent_tag == s.parent_tag
            and existing.parent_content_hash == s.parent_content_hash and existing.diff_sha256 == s.diff_sha256
            and existing.disk_sha256 == s.disk_sha256)
