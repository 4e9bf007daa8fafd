"""The pack manifest (forkd-pack.json): built from a chain when packing, parsed and validated when reading."""

from __future__ import annotations

import json
import re
import time

from forkd import __version__
from forkd.base.settings import settings
from forkd.core.pack.rules import (
    BASE_FILES,
    IMAGE_DISK,
    IMAGE_FILES,
    LAYER_FILES,
    MAX_MANIFEST_BYTES,
    MAX_MEMBER_BYTES,
    PACK_FORMAT,
    PACK_MANIFEST,
    PACK_VERSION,
    PackError,
    check_name,
    check_unowned_tag,
    member_kind,
    safe_relpath,
)
from forkd.store.snapshot import DISK, MANIFEST, Snapshot

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def build_manifest(tag: str, snaps: list[Snapshot], image_ids: list[str], listed: list[dict]) -> dict:
    """The manifest of a pack holding `snaps` (root first, head `tag`), their images and the `listed` members."""
    return {"format": PACK_FORMAT, "version": PACK_VERSION, "head": tag, "chain": [s.tag for s in snaps],
            "image_id": snaps[-1].image_id, "images": image_ids, "created_at": time.time(),
            "forkd_version": __version__, "members": listed}


def parse_manifest(raw: bytes, owned: bool = False) -> dict:
    """The validated manifest, with `_members` mapping each member path to its declared size and sha256. `owned`:
    the caller pinned the pack's digest to one it trusts, so the chain may hold tags the reconciler owns."""
    try:
        m = json.loads(raw)
    except ValueError as exc:
        raise PackError(f"pack manifest {PACK_MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(m, dict) or m.get("format") != PACK_FORMAT:
        raise PackError(f"{PACK_MANIFEST} is not a forkd pack manifest")
    if m.get("version") != PACK_VERSION:
        raise PackError(f"pack format version {m.get('version')!r} is not supported (this forkd reads "
                        f"{PACK_VERSION})", hint="upgrade forkd")
    chain = m.get("chain")
    if not isinstance(chain, list) or not chain or len(chain) > 256:
        raise PackError("pack manifest: 'chain' must list 1..256 snapshot tags, root first")
    for t in chain:
        check_name(t, "snapshot tag in 'chain'")
        if not owned:
            check_unowned_tag(t)
    if len(set(chain)) != len(chain):
        raise PackError("pack manifest: 'chain' repeats a tag")
    if m.get("head") != chain[-1]:
        raise PackError(f"pack manifest: head {m.get('head')!r} is not the last link of the chain")
    images = m.get("images")
    if not isinstance(images, list) or not images:
        raise PackError("pack manifest: 'images' must list the guest image ids")
    for i in images:
        check_name(i, "image id")
    if m.get("image_id") not in images:
        raise PackError("pack manifest: 'image_id' is not among 'images'")
    m["_members"] = _parse_members(m.get("members"), chain, images)
    return m


def _parse_members(members: object, chain: list[str], images: list[str]) -> dict[str, dict]:
    """{path: {size, sha256}} of the manifest's member entries, each checked, every snapshot and image whole."""
    if not isinstance(members, list) or not members:
        raise PackError("pack manifest: 'members' is missing")
    seen: dict[str, dict] = {}
    for e in members:
        if not isinstance(e, dict):
            raise PackError("pack manifest: a member entry is not an object")
        path = safe_relpath(e.get("path"), "manifest")  # the upstream defect 7 rule: never trust these paths
        member_kind(path, chain, images)
        size, digest, mode = e.get("size"), e.get("sha256"), e.get("mode")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_MEMBER_BYTES:
            raise PackError(f"pack manifest: member {str(path)!r} has an invalid size {size!r}")
        if not isinstance(digest, str) or not _SHA_RE.match(digest):
            raise PackError(f"pack manifest: member {str(path)!r} has an invalid sha256 {digest!r}")
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
            raise PackError(f"pack manifest: member {str(path)!r} has an invalid mode {mode!r}")
        if path.name in (MANIFEST, "image.json") and size > MAX_MANIFEST_BYTES:
            raise PackError(f"pack manifest: member {str(path)!r} is implausibly large ({size} bytes)")
        if str(path) in seen:
            raise PackError(f"pack manifest lists {str(path)!r} twice")
        seen[str(path)] = {"size": size, "sha256": digest}
    _check_total(seen)
    for i, t in enumerate(chain):  # a disk (DISK) is optional here: check_staged matches it to the snapshot
        have = {p.rsplit("/", 1)[1] for p in seen if p.startswith(f"snapshots/{t}/")}
        want = set(LAYER_FILES if i else BASE_FILES)
        if have - {DISK} != want:
            raise PackError(f"pack manifest: snapshot {t!r} must hold exactly {', '.join(sorted(want))} "
                            f"and, if disk-backed, {DISK} (lists {', '.join(sorted(have)) or 'nothing'})")
    for i in images:
        have = {p.rsplit("/", 1)[1] for p in seen if p.startswith(f"images/{i}/")}
        if have - {IMAGE_DISK} != set(IMAGE_FILES):
            raise PackError(f"pack manifest: image {i!r} must hold exactly {', '.join(IMAGE_FILES)} "
                            f"and, if disk-backed, {IMAGE_DISK}")
    return seen


def _check_total(seen: dict[str, dict]) -> None:
    """Refuse, before anything is written, a pack whose members add up to more than FORKD_PACK_MAX_BYTES."""
    total, limit = sum(e["size"] for e in seen.values()), settings().pack_max_bytes
    if total > limit:
        raise PackError(f"pack manifest: its members add up to {total} bytes, more than the {limit} a pack may "
                        "unpack to: refused before writing anything",
                        hint="if you trust this pack, raise FORKD_PACK_MAX_BYTES (bytes)")
