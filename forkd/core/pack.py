"""Packs: a chain of snapshots plus the guest image it needs, as one `tar` stream compressed with zstandard.

Layout of a pack (members in this order):
    forkd-pack.json                          the manifest: format, head tag, chain root->head, image ids, and for
                                             every member its path, size, sha256 and mode
    snapshots/<tag>/{snapshot.json, vmstate, memory.bin | diff.pages + diff.data}   each snapshot, root first
    images/<id>/{vmlinuz, initrd.img, image.json}                                   the guest image(s)

Unpacking trusts nothing in the file: every path is checked against a whitelist shape (no absolute paths, no
`..`, only regular files and directories, only members the manifest lists, none larger than declared), every
file is streamed into a private directory under $FORKD_HOME/tmp and hashed, the snapshot manifests are checked
against each other (parents, content hashes, diff hashes, image), and only then is each snapshot / image
directory moved into place with one rename. Anything that fails removes the private directory: nothing else
was written. Unpacking the same pack twice is a no-op; a tag that exists with other content is a Conflict.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO

import zstandard

from forkd import __version__
from forkd.base.atomic import fsync_dir
from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.hashing import sha256_file
from forkd.base.names import TAG_PATTERN, check_tag
from forkd.image.build import Image
from forkd.store import chain as chainmod
from forkd.store.snapshot import MANIFEST, MEMORY, VMSTATE, CorruptManifest, Snapshot

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

PACK_MANIFEST = "forkd-pack.json"
PACK_FORMAT = "forkd-pack"
PACK_VERSION = 1
MAX_MANIFEST_BYTES = 4 << 20
MAX_MEMBER_BYTES = 1 << 40
CHUNK = 1 << 20
BASE_FILES = (MANIFEST, VMSTATE, MEMORY)
LAYER_FILES = (MANIFEST, VMSTATE, chainmod.PAGES_FILE, chainmod.DATA_FILE)
IMAGE_FILES = ("vmlinuz", "initrd.img", "image.json")
_NAME_RE = re.compile(TAG_PATTERN)
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_ZEROS = bytes(CHUNK)

Progress = Callable[[str], None]


class PackError(ForkdError):
    """A pack that is malformed, unsafe, corrupt or truncated."""

    exit_code = 2


def _quiet(_: str) -> None:
    pass


# -- path rules -----------------------------------------------------------------------------------------
def safe_relpath(path: Any, what: str = "member") -> PurePosixPath:
    """A relative POSIX path without '..', '.', empty or odd components, or refuse (PackError)."""
    if not isinstance(path, str) or not path or len(path) > 512:
        raise PackError(f"pack {what} path {path!r} is not a usable name")
    if "\\" in path or "\0" in path or any(ord(c) < 32 for c in path):
        raise PackError(f"pack {what} path {path!r} contains a backslash or a control character")
    if path.startswith("/"):
        raise PackError(f"pack {what} path {path!r} is absolute: refused")
    parts = path.rstrip("/").split("/")
    if any(p == ".." for p in parts):
        raise PackError(f"pack {what} path {path!r} contains '..': refused (path traversal)")
    if any(p in ("", ".") for p in parts):
        raise PackError(f"pack {what} path {path!r} has an empty or '.' component: refused")
    return PurePosixPath(*parts)


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise PackError(f"pack manifest: invalid {what} {value!r}")
    return value


def _member_kind(path: PurePosixPath, chain: list[str], images: list[str]) -> tuple[str, str, str]:
    """('snapshots'|'images', tag-or-id, file) for a member path of the allowed shape, else PackError."""
    parts = path.parts
    ok = (len(parts) == 3 and ((parts[0] == "snapshots" and parts[1] in chain
                                and parts[2] in set(BASE_FILES) | set(LAYER_FILES))
                               or (parts[0] == "images" and parts[1] in images and parts[2] in IMAGE_FILES)))
    if not ok:
        raise PackError(f"pack member {str(path)!r} is not one of the files a pack may hold "
                        "(snapshots/<tag>/<snapshot file> of the chain, images/<id>/<image file>)")
    return parts[0], parts[1], parts[2]


# -- packing ----------------------------------------------------------------------------------------------
class _HashingReader:
    """A file object for tarfile that hashes what it hands out, so a file changed while packing is caught."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.h = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        return b


def _file_hash(path: Path) -> str:
    # the memory file is sparse: hash it extent by extent (holes as zeros), the store's own definition
    return chainmod.hash_image(path) if path.name == MEMORY else sha256_file(path)


def pack(rt: Runtime, tag: str, out: Path, progress: Progress = _quiet, level: int = 3) -> dict:
    """Write the chain of `tag` (every ancestor, root first) and its guest image to `out` (.tar.zst)."""
    t0 = time.perf_counter()
    check_tag(tag)
    snaps = rt.store.ancestors(tag)  # every link present, ready, and holding the content its child was built on
    for s in snaps:
        if s.status != "ready":
            raise Conflict(f"snapshot {s.tag!r} is {s.status}: only ready snapshots can be packed")
    image_ids = list(dict.fromkeys(s.image_id for s in snaps))
    members: list[tuple[str, Path]] = []
    for s in snaps:
        d = rt.store.dir(s.tag)
        for name in (LAYER_FILES if s.is_layer else BASE_FILES):
            members.append((f"snapshots/{s.tag}/{name}", d / name))
    for image_id in image_ids:
        image = rt.image(image_id)
        for name in IMAGE_FILES:
            members.append((f"images/{image_id}/{name}", image.dir / name))
    progress(f"hashing {len(members)} files of {len(snaps)} snapshots")
    listed = []
    for arc, p in members:
        if not p.is_file() or p.is_symlink():
            raise ForkdError(f"{p} is missing or not a regular file; cannot pack {tag!r}")
        digest = _file_hash(p)
        listed.append({"path": arc, "size": p.stat().st_size, "sha256": digest, "mode": 0o444})
    for s in snaps:  # refuse to pack what no longer matches its own manifest
        by = {m["path"]: m["sha256"] for m in listed}
        if not s.is_layer and by[f"snapshots/{s.tag}/{MEMORY}"] != s.memory_sha256:
            raise ForkdError(f"snapshot {s.tag!r}: its memory file no longer matches its recorded hash",
                             hint=f"delete it with 'forkd rmi --force {s.tag}' and create it again")
        if s.is_layer and chainmod.diff_hash(rt.store.dir(s.tag)) != s.diff_sha256:
            raise ForkdError(f"snapshot {s.tag!r}: its diff files no longer match their recorded hash",
                             hint=f"delete it with 'forkd rmi --force --cascade {s.tag}' and rebuild")
    manifest = {"format": PACK_FORMAT, "version": PACK_VERSION, "head": tag, "chain": [s.tag for s in snaps],
                "image_id": snaps[-1].image_id, "images": image_ids, "created_at": time.time(),
                "forkd_version": __version__, "members": listed}
    raw = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    out = Path(out).absolute()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        with open(tmp, "xb") as fh:
            cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=-1)
            with cctx.stream_writer(fh, closefd=False) as zw:
                with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
                    now = int(time.time())
                    info = tarfile.TarInfo(PACK_MANIFEST)
                    info.size, info.mode, info.mtime = len(raw), 0o444, now
                    tar.addfile(info, _BytesReader(raw))
                    for (arc, p), m in zip(members, listed, strict=True):
                        progress(f"adding {arc} ({m['size']} bytes)")
                        info = tarfile.TarInfo(arc)
                        info.size, info.mode, info.mtime = m["size"], 0o444, now
                        with open(p, "rb") as f:
                            r = _HashingReader(f)
                            tar.addfile(info, r)
                        if r.h.hexdigest() != m["sha256"]:
                            raise ForkdError(f"{p} changed while it was being packed")
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"tag": tag, "chain": manifest["chain"], "image_id": manifest["image_id"], "path": str(out),
            "members": len(listed), "logical_bytes": sum(m["size"] for m in listed),
            "pack_bytes": out.stat().st_size, "seconds": round(time.perf_counter() - t0, 3)}


class _BytesReader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        b = self.data[self.pos:end]
        self.pos += len(b)
        return b


# -- unpacking --------------------------------------------------------------------------------------------
class _ZstdStream:
    """Decompressed bytes of a pack for tarfile; notes when the input ran out (a truncated archive)."""

    def __init__(self, fh: BinaryIO):
        self.reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=False)
        self.hit_eof = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = CHUNK
        buf = bytearray()
        try:
            while len(buf) < n:
                b = self.reader.read(n - len(buf))
                if not b:
                    self.hit_eof = True
                    break
                buf += b
        except zstandard.ZstdError as exc:
            raise PackError(f"the pack is not valid zstandard data ({exc})") from None
        return bytes(buf)


def _parse_manifest(raw: bytes) -> dict:
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
        _check_name(t, "snapshot tag in 'chain'")
    if len(set(chain)) != len(chain):
        raise PackError("pack manifest: 'chain' repeats a tag")
    if m.get("head") != chain[-1]:
        raise PackError(f"pack manifest: head {m.get('head')!r} is not the last link of the chain")
    images = m.get("images")
    if not isinstance(images, list) or not images:
        raise PackError("pack manifest: 'images' must list the guest image ids")
    for i in images:
        _check_name(i, "image id")
    if m.get("image_id") not in images:
        raise PackError("pack manifest: 'image_id' is not among 'images'")
    members = m.get("members")
    if not isinstance(members, list) or not members:
        raise PackError("pack manifest: 'members' is missing")
    seen: dict[str, dict] = {}
    for e in members:
        if not isinstance(e, dict):
            raise PackError("pack manifest: a member entry is not an object")
        path = safe_relpath(e.get("path"), "manifest")  # the upstream defect 7 rule: never trust these paths
        _member_kind(path, chain, images)
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
    for i, t in enumerate(chain):
        have = {p.rsplit("/", 1)[1] for p in seen if p.startswith(f"snapshots/{t}/")}
        want = set(LAYER_FILES if i else BASE_FILES)
        if have != want:
            raise PackError(f"pack manifest: snapshot {t!r} must hold exactly {', '.join(sorted(want))} "
                            f"(lists {', '.join(sorted(have)) or 'nothing'})")
    for i in images:
        have = {p.rsplit("/", 1)[1] for p in seen if p.startswith(f"images/{i}/")}
        if have != set(IMAGE_FILES):
            raise PackError(f"pack manifest: image {i!r} must hold exactly {', '.join(IMAGE_FILES)}")
    m["_members"] = seen
    return m


def _write_member(src: BinaryIO, dest: Path, declared: int, sparse: bool) -> tuple[int, str]:
    """Copy at most declared+1 bytes into a new file (holes for zero chunks if `sparse`). Returns (size, sha)."""
    h = hashlib.sha256()
    n = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        while n <= declared:
            b = src.read(min(CHUNK, declared + 1 - n))
            if not b:
                break
            h.update(b)
            if sparse and b == _ZEROS[:len(b)]:
                os.lseek(fd, len(b), os.SEEK_CUR)
            else:
                os.write(fd, b)
            n += len(b)
        os.ftruncate(fd, n)
        os.fsync(fd)
    finally:
        os.close(fd)
    return n, h.hexdigest()


def _extract(fh: BinaryIO, stage: Path, progress: Progress) -> dict:
    """Stream the pack into `stage`, checking every member; return the manifest."""
    stream = _ZstdStream(fh)
    try:
        # read in tar records: a pack's tar stream is a whole number of them, so a short read means truncation
        tar = tarfile.open(fileobj=stream, mode="r|", bufsize=tarfile.RECORDSIZE)
    except tarfile.TarError as exc:
        raise PackError(f"not a forkd pack (tar): {exc}") from None
    manifest: dict | None = None
    done: set[str] = set()
    try:
        for info in tar:
            name = info.name
            if manifest is None:
                if name != PACK_MANIFEST or not info.isreg():
                    raise PackError(f"the first member of a pack must be {PACK_MANIFEST} (found {name!r})")
                if info.size > MAX_MANIFEST_BYTES:
                    raise PackError(f"{PACK_MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
                f = tar.extractfile(info)
                manifest = _parse_manifest(f.read(MAX_MANIFEST_BYTES + 1) if f else b"")
                continue
            path = safe_relpath(name)
            kinds = {"directory": info.isdir(), "regular file": info.isreg()}
            if not any(kinds.values()):
                what = ("symlink" if info.issym() else "hard link" if info.islnk() else
                        "device file" if info.ischr() or info.isblk() else "special file")
                raise PackError(f"pack member {name!r} is a {what}: packs may hold only regular files")
            entries = manifest["_members"]
            if info.isdir():
                ok = {str(PurePosixPath(*p.split("/")[:k])) for p in entries for k in (1, 2)}
                if str(path) not in ok:
                    raise PackError(f"pack member {name!r} (a directory) is not part of the manifest")
                continue
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
            got, digest = _write_member(src, dest, declared, sparse=path.name == MEMORY)
            if got > declared:
                raise PackError(f"pack member {name!r} is larger than declared ({declared} bytes)")
            if got != declared:
                raise PackError(f"pack member {name!r} is shorter than declared ({got} < {declared} bytes): "
                                "the pack is truncated")
            if digest != entries[key]["sha256"]:
                raise PackError(f"pack member {name!r} does not match its sha256 in the manifest "
                                f"({digest[:12]} != {entries[key]['sha256'][:12]}): the pack is corrupt")
            done.add(key)
            progress(f"verified {name}")
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
    return manifest


def _check_staged(stage: Path, m: dict) -> tuple[list[Snapshot], list[Image]]:
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
        snaps.append(s)
    return snaps, images


def _same_image(target: Path, m: dict, image_id: str) -> bool:
    try:
        return all(sha256_file(target / name) == m["_members"][f"images/{image_id}/{name}"]["sha256"]
                   for name in IMAGE_FILES)
    except OSError:
        return False


def _same_snapshot(existing: Snapshot, s: Snapshot) -> bool:
    return (existing.status == "ready" and existing.memory_sha256 == s.memory_sha256
            and existing.vmstate_sha256 == s.vmstate_sha256 and existing.parent_tag == s.parent_tag
            and existing.parent_content_hash == s.parent_content_hash and existing.diff_sha256 == s.diff_sha256)


def unpack(rt: Runtime, path: Path, progress: Progress = _quiet) -> dict:
    """Verify a pack completely in a private directory, then move each snapshot and image into place."""
    t0 = time.perf_counter()
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"{path} is not a file")
    layout = rt.layout
    stage = layout.tmp / f"unpack-{os.getpid()}-{secrets.token_hex(4)}"
    stage.mkdir(mode=0o700)
    try:
        with open(path, "rb") as fh:
            m = _extract(fh, stage, progress)
        snaps, images = _check_staged(stage, m)
        # decide everything before moving anything: conflicts are refused with nothing installed
        plan: list[tuple[Path, Path, str]] = []
        skipped: list[str] = []
        for img in images:
            target = layout.images / img.id
            if target.exists():
                if not _same_image(target, m, img.id):
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
                if existing is None or not _same_snapshot(existing, s):
                    raise Conflict(f"snapshot {s.tag!r} already exists with different content",
                                   hint=f"delete it with 'forkd rmi {s.tag}' or unpack into another FORKD_HOME")
                skipped.append(s.tag)
            else:
                plan.append((stage / "snapshots" / s.tag, target, s.tag))
        installed = []
        for src, target, label in plan:  # images first, then the chain root to head: never a head alone
            for f in src.iterdir():
                os.chmod(f, 0o444)
            os.chmod(src, 0o755)
            fsync_dir(src)
            try:
                os.rename(src, target)
            except OSError as exc:
                if target.exists():
                    raise Conflict(f"{label} appeared while unpacking; run the unpack again") from exc
                raise
            fsync_dir(target.parent)
            installed.append(label)
            progress(f"installed {label}")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {"head": m["head"], "chain": m["chain"], "image_id": m["image_id"], "installed": installed,
            "skipped": skipped, "members": len(m["_members"]),
            "logical_bytes": sum(e["size"] for e in m["_members"].values()),
            "seconds": round(time.perf_counter() - t0, 3)}


def read_manifest(path: Path) -> dict:
    """The manifest of a pack (the first member only; nothing is verified beyond its own rules)."""
    with open(path, "rb") as fh:
        stream = _ZstdStream(fh)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                info = tar.next()
                if info is None or info.name != PACK_MANIFEST or not info.isreg() or info.size > MAX_MANIFEST_BYTES:
                    raise PackError(f"the first member of a pack must be {PACK_MANIFEST}")
                f = tar.extractfile(info)
                m = _parse_manifest(f.read() if f else b"")
        except tarfile.TarError as exc:
            raise PackError(f"not a forkd pack: {exc}") from None
    m.pop("_members", None)
    return m
