"""Packs as OCI artifacts: `push` a snapshot chain to a registry, `pull` it elsewhere by digest.

An artifact is one OCI image manifest (artifactType ARTIFACT_TYPE) whose config is a small JSON summary of the
chain (CONFIG_TYPE) and whose one layer is the pack file itself (PACK_TYPE: forkd.core.pack's .tar.zst). skopeo
moves the bytes both ways (`oci:` layout -> `docker://` on push, `docker://REPO@DIGEST` -> `dir:` on pull), so
credentials, CA certificates and the plain-HTTP rule are exactly those of image pulls (forkd.image.registry).

Everything the registry sends is untrusted. A pull reads the manifest first (bounded) and refuses it unless it
hashes to the pinned digest and has this module's shape (media types, one config, one layer, sizes within
FORKD_PACK_MAX_BYTES and the free space); after the copy, the copied manifest must hash to the digest again and
every blob must be a regular file of its declared size and digest; only then is the pack unpacked, by the pack
unpacker with all its own checks (paths, members, hashes, chain). A pull `owned` (the operator distributing a
build of its own) must name a digest, never a tag: it keeps the tags and labels the reconciler owns.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd.base.errors import ForkdError, InvalidInput, Unavailable
from forkd.base.hashing import sha256_file
from forkd.base.owners import owned_name
from forkd.base.settings import settings
from forkd.core.pack.read import unpack
from forkd.core.pack.rules import PackError, Progress, quiet
from forkd.core.pack.write import pack
from forkd.image.registry import PREFIX, Reference, RegistryOptions, parse, skopeo

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

ARTIFACT_TYPE = "application/vnd.forkd.snapshot.v1"
CONFIG_TYPE = "application/vnd.forkd.snapshot.config.v1+json"
PACK_TYPE = "application/vnd.forkd.pack.v1.tar+zstd"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
MAX_MANIFEST_BYTES = 64 << 10  # one config and one layer descriptor: a few hundred bytes
MAX_CONFIG_BYTES = 64 << 10
_LAYOUT_TAG = "forkd"


def reference(ref: str) -> Reference:
    """`[docker://]HOST[:PORT]/NAME[:TAG][@sha256:DIGEST]`, parsed (the docker:// prefix is optional)."""
    return parse(ref if ref.startswith(PREFIX) else PREFIX + ref)


def _digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _descriptor(media_type: str, path: Path) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": "sha256:" + sha256_file(path), "size": path.stat().st_size}


def _layout(work: Path, pack_file: Path, summary: dict[str, Any]) -> tuple[Path, bytes]:
    """An OCI layout under `work` holding the artifact for `pack_file`: (layout dir, manifest bytes)."""
    lay = work / "layout"
    blobs = lay / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = _descriptor(PACK_TYPE, pack_file)
    layer["annotations"] = {"org.opencontainers.image.title": f"{summary['head']}.tar.zst"}
    os.rename(pack_file, blobs / layer["digest"].partition(":")[2])
    cfg = (json.dumps(summary, sort_keys=True) + "\n").encode()
    (blobs / _digest(cfg).partition(":")[2]).write_bytes(cfg)
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
           "config": {"mediaType": CONFIG_TYPE, "digest": _digest(cfg), "size": len(cfg)}, "layers": [layer],
           "annotations": {"dev.forkd.head": summary["head"]}}
    raw = json.dumps(doc, sort_keys=True).encode()
    (blobs / _digest(raw).partition(":")[2]).write_bytes(raw)
    index = {"schemaVersion": 2, "manifests": [{"mediaType": MANIFEST_TYPE, "digest": _digest(raw), "size": len(raw),
                                                 "annotations": {"org.opencontainers.image.ref.name": _LAYOUT_TAG}}]}
    (lay / "index.json").write_text(json.dumps(index))
    (lay / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return lay, raw


def push_reference(ref: str) -> Reference:
    """A reference to push to: it names a tag and no digest (the registry gives the digest), else InvalidInput."""
    r = reference(ref)
    if r.digest or not r.tag:
        raise InvalidInput(f"push to {r.text}: name a tag (HOST/NAME:TAG); the registry gives the digest",
                           hint="e.g. 127.0.0.1:5000/forkd/base:v1")
    return r


def publish(pack_file: Path, summary: dict[str, Any], ref: str, options: RegistryOptions | None, work: Path) -> str:
    """Push `pack_file` (moved into a layout under `work`) as an artifact to `ref` (a tag); its manifest digest."""
    r = push_reference(ref)
    lay, raw = _layout(work, pack_file, summary)
    digestfile = work / "digest"
    options = options or RegistryOptions()
    skopeo(["copy", "--quiet", f"--digestfile={digestfile}", *options.flags("dest-"), f"oci:{lay}:{_LAYOUT_TAG}",
            f"{PREFIX}{r.repository}:{r.tag}"], "pushing to", r)
    got = digestfile.read_text().strip()
    if got != _digest(raw):
        raise ForkdError(f"push to {r.text}: skopeo stored a manifest with digest {got}, not the artifact's "
                         f"{_digest(raw)} (was it rewritten on the way?)", hint="upgrade skopeo, then push again")
    return got


def push(rt: Runtime, tag: str, ref: str, options: RegistryOptions | None = None, progress: Progress = quiet,
         level: int = 3, owned: bool = False) -> dict[str, Any]:
    """Pack the chain of `tag` and push it as an artifact to `ref` (HOST/NAME:TAG)."""
    t0 = time.perf_counter()
    r = push_reference(ref)  # before the pack is written
    work = rt.layout.tmp / owned_name("oci-push")
    work.mkdir(mode=0o700)
    try:
        res = pack(rt, tag, work / "pack.tar.zst", progress, level=level, owned=owned)
        progress(f"pushing {res['pack_bytes']} bytes to {r.text}")
        digest = publish(work / "pack.tar.zst", res["manifest"], ref, options, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"tag": tag, "chain": res["chain"], "image_id": res["image_id"], "ref": r.text, "digest": digest,
            "pinned": f"{PREFIX}{r.repository}@{digest}", "pack_bytes": res["pack_bytes"],
            "logical_bytes": res["logical_bytes"], "seconds": round(time.perf_counter() - t0, 3)}


def check_manifest(raw: bytes, digest: str, what: str) -> tuple[dict, dict]:
    """(config, layer) descriptors of an artifact manifest that hashes to `digest` and has forkd's shape, else
    InvalidInput naming `what` (the reference)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise InvalidInput(f"{what}: the registry sent a manifest of {len(raw)} bytes (an artifact's is at most "
                           f"{MAX_MANIFEST_BYTES}); refused")
    if _digest(raw) != digest:
        raise InvalidInput(f"{what}: the registry answered with a manifest whose digest is {_digest(raw)}, not the "
                           f"pinned {digest}; refused", hint="the registry or the path to it altered the manifest")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"{what}: the manifest ({digest}) is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("mediaType") != MANIFEST_TYPE or doc.get("artifactType") != ARTIFACT_TYPE:
        kind = doc.get("artifactType") or doc.get("mediaType") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidInput(f"{what}: {digest} is not a forkd snapshot artifact ({kind!r}, expected artifactType "
                           f"{ARTIFACT_TYPE})", hint="push it with 'forkd snapshot push TAG REF'")
    cfg, layers = doc.get("config"), doc.get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        raise InvalidInput(f"{what}: a forkd snapshot artifact has exactly one layer (the pack); {digest} has "
                           f"{len(layers) if isinstance(layers, list) else 'no list of'} layers")
    _check_descriptor(cfg, CONFIG_TYPE, MAX_CONFIG_BYTES, f"{what}: config")
    _check_descriptor(layers[0], PACK_TYPE, settings().pack_max_bytes, f"{what}: the pack layer")
    return cfg, layers[0]


def _check_descriptor(d: Any, media_type: str, limit: int, what: str) -> None:
    if not isinstance(d, dict) or d.get("mediaType") != media_type:
        raise InvalidInput(f"{what} has media type {d.get('mediaType') if isinstance(d, dict) else None!r}, "
                           f"not {media_type}")
    dig, size = d.get("digest"), d.get("size")
    if not isinstance(dig, str) or not dig.startswith("sha256:") or len(dig) != 71 \
            or any(c not in "0123456789abcdef" for c in dig[7:]):
        raise InvalidInput(f"{what} has a malformed digest {str(dig)[:80]!r} (only sha256 is accepted)")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= limit:
        raise InvalidInput(f"{what} ({dig}) declares {size!r} bytes; at most {limit} are accepted",
                           hint="if you trust this registry, raise FORKD_PACK_MAX_BYTES (bytes)"
                           if media_type == PACK_TYPE else None)


def check_copy(root: Path, digest: str, descriptors: list[dict], what: str) -> dict[str, Path]:
    """The blobs of a skopeo `dir:` copy, each checked: manifest.json hashes to `digest`, and every descriptor's
    blob is a regular file (no link) of its size and digest. {digest: path}."""
    raw = _read_bounded(root / "manifest.json", MAX_MANIFEST_BYTES, f"{what}: the copied manifest")
    if _digest(raw) != digest:
        raise InvalidInput(f"{what}: the copied manifest hashes to {_digest(raw)}, not the pinned {digest}; refused")
    out = {}
    for d in descriptors:
        p = root / d["digest"].partition(":")[2]
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            raise InvalidInput(f"{what}: blob {d['digest']} is missing from the copy") from None
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{what}: blob {d['digest']} is not a regular file in the copy; refused")
        if st.st_size != d["size"]:
            raise InvalidInput(f"{what}: blob {d['digest']} holds {st.st_size} bytes, not the {d['size']} its "
                               "manifest declares; refused")
        got = "sha256:" + sha256_file(p)
        if got != d["digest"]:
            raise InvalidInput(f"{what}: blob {d['digest']} hashes to {got}: tampered or corrupt; refused, nothing "
                               "installed")
        out[d["digest"]] = p
    return out


def _read_bounded(p: Path, limit: int, what: str) -> bytes:
    try:
        with open(p, "rb", opener=lambda f, fl: os.open(f, fl | os.O_NOFOLLOW)) as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"{what} ({p}) cannot be read: {exc}") from None
    if len(raw) > limit:
        raise InvalidInput(f"{what} is larger than {limit} bytes; refused")
    return raw


def pull(rt: Runtime, ref: str, options: RegistryOptions | None = None, progress: Progress = quiet,
         owned: bool = False) -> dict[str, Any]:
    """Pull the artifact `ref` names (best by digest: HOST/NAME@sha256:...), verify it and unpack its pack."""
    t0 = time.perf_counter()
    r, options = reference(ref), options or RegistryOptions()
    if owned and not r.digest:
        raise InvalidInput(f"pull {r.text}: an owned pull must name a digest (HOST/NAME@sha256:...), never a tag")
    at = r.repository + (f"@{r.digest}" if r.digest else f":{r.tag or 'latest'}")
    raw = skopeo(["inspect", "--raw", "--no-tags", *options.flags(), PREFIX + at], "reading the manifest of", r)
    digest = r.digest or _digest(raw)
    cfg, layer = check_manifest(raw, digest, r.text)
    free = shutil.disk_usage(rt.layout.tmp).free
    if layer["size"] * 2 > free:
        raise Unavailable(f"pull {r.text}: its pack takes {layer['size']} bytes and only {free} bytes are free "
                          f"under {rt.layout.tmp}", hint="free some space, or forkd gc")
    work = rt.layout.tmp / owned_name("oci-pull")
    work.mkdir(mode=0o700)
    try:
        progress(f"pulling {r.repository}@{digest} ({layer['size']} bytes)")
        skopeo(["copy", "--quiet", *options.flags("src-"), f"{PREFIX}{r.repository}@{digest}", f"dir:{work / 'c'}"],
               "pulling", r)
        blobs = check_copy(work / "c", digest, [cfg, layer], r.text)
        try:
            res = unpack(rt, blobs[layer["digest"]], progress, owned=owned, source=f"oci:{r.repository}@{digest}")
        except PackError as exc:
            raise PackError(f"{r.repository}@{digest}: {exc.message}", hint=exc.hint) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**res, "ref": r.text, "digest": digest, "pinned": f"{PREFIX}{r.repository}@{digest}",
            "pack_bytes": layer["size"], "seconds": round(time.perf_counter() - t0, 3)}
