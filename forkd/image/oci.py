"""Guest images from container images, without a container engine: an OCI image layout directory
(index.json -> manifest -> layer blobs) or a `docker save` tarball (manifest.json + layer tars).

The layers are unpacked in order into a rootfs directory, honouring whiteouts (`.wh.NAME` deletes NAME from
lower layers, `.wh..wh..opq` hides a directory's lower content). Member paths are resolved inside the rootfs
like a chroot would (absolute symlinks point into the rootfs, `..` stops at its top), so nothing is ever
written outside it; absolute or `..` member names, hard links to outside and relative symlinks climbing
above the root are refused; device nodes are skipped (the guest has devtmpfs).

forkd's init, agent, a static busybox (for init, and /bin/sh if the image has none) and the kernel's virtio
modules are injected; the image's own python3 (>= 3.8) runs the agent. The rootfs is packed as an
uncompressed initramfs (it lives in guest RAM, shared copy-on-write by the children) or, with `rootfs=disk`
(or `auto` for a big one), as an ext4 root disk every child writes through its own overlay (see
forkd.image.rootfs), into a content-addressed image directory with image.json saying where it came from.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from forkd.base.errors import InvalidInput, NotFound
from forkd.image.beneath import SETID, Escape, Tree
from forkd.image.rootfs import (
    Progress,
    UnsafeImage,
    resolve_in,
)

OCI_BUILDER_VERSION = "1"
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
}
INDEX_TYPES = {"application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json"}
MANIFEST_TYPES = {"application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json"}



# ---------------------------------------------------------------- sources
@dataclass
class Layer:
    name: str              # for messages: the digest or the member name
    compression: str       # "tar" | "gzip" | "auto"
    open: Callable[[], IO[bytes]]
    digest: str | None = None  # "sha256:<hex>" to verify while reading, when known


@dataclass
class Source:
    kind: str              # "oci-layout" | "docker-save"
    ref: str
    digest: str            # identifies the image content: the manifest digest (OCI) or the config digest (docker)
    layers: list[Layer] = field(default_factory=list)
    config: dict = field(default_factory=dict)


def _blob_path(root: Path, digest: str, what: str) -> Path:
    return sha256_blob_path(root, root / "blobs" / "sha256" / digest.partition(":")[2], digest, what)


def sha256_blob_path(root: Path, p: Path, digest: str, what: str) -> Path:
    """`p`, the file of blob `digest` inside the layout `root`, checked: a sha256 digest, inside `root`, present."""
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
        raise InvalidInput(f"{what} has an unsupported or malformed digest {digest!r} (only sha256 is supported)")
    p = _inside(root, p, what)
    if not p.is_file():
        raise NotFound(f"{what} blob {digest} not found: {p} is missing (the image copy is incomplete)",
                       hint="re-export the image with all its layers (e.g. skopeo copy ... oci:DIR)")
    return p


def _inside(root: Path, p: Path, what: str) -> Path:
    """`p` with its symlinks resolved, refused unless it stays inside the layout directory `root`."""
    real, top = Path(os.path.realpath(p)), Path(os.path.realpath(root))
    if top not in real.parents:
        raise UnsafeImage(f"{what}: {p} resolves to {real}, outside the image layout {root}",
                          hint="an OCI layout's index.json and blobs must be files inside it, not symlinks out")
    return real


def _read_json(p: Path, what: str) -> dict:
    try:
        return json.loads(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{what} ({p}) is missing or not JSON: {exc}") from exc


def pick_manifest(entries: list[dict], where: str) -> dict:
    if not entries:
        raise InvalidInput(f"{where} lists no manifests")
    for e in entries:
        plat = e.get("platform") or {}
        if plat.get("os", "linux") == "linux" and plat.get("architecture", "amd64") == "amd64":
            return e
    plats = ", ".join(f"{(e.get('platform') or {}).get('os')}/{(e.get('platform') or {}).get('architecture')}"
                      for e in entries)
    raise InvalidInput(f"{where} has no linux/amd64 image (it has {plats})")


def _oci_layout(root: Path) -> Source:
    index = _read_json(_inside(root, root / "index.json", "index.json"), "the OCI layout's index.json")
    desc = pick_manifest(index.get("manifests") or [], f"{root}/index.json")
    for _ in range(4):  # an index may point at a nested index (e.g. buildx output)
        mt = desc.get("mediaType", "")
        blob = _blob_path(root, desc.get("digest", ""), "manifest")
        doc = _read_json(blob, f"manifest {desc.get('digest')}")
        mt = mt or doc.get("mediaType", "")
        if mt in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
            desc = pick_manifest(doc.get("manifests") or [], f"index {desc.get('digest')}")
            continue
        if mt and mt not in MANIFEST_TYPES:
            raise InvalidInput(f"manifest {desc.get('digest')} has unsupported media type {mt!r}",
                               hint=f"supported: {', '.join(sorted(MANIFEST_TYPES))}")
        break
    else:
        raise InvalidInput(f"{root}: indexes nest too deeply")
    return manifest_source("oci-layout", str(root), desc["digest"], doc, lambda d, what: _blob_path(root, d, what))


def manifest_source(kind: str, ref: str, digest: str, doc: dict, blob: Callable[[str, str], Path]) -> Source:
    """The Source an image manifest `doc` describes, its config and layers found by `blob(digest, what)`; a layer
    is verified against its digest when read, the config here."""
    config = {}
    if (doc.get("config") or {}).get("digest"):
        cdigest = doc["config"]["digest"]
        cpath = blob(cdigest, "config")
        if "sha256:" + hashlib.sha256(cpath.read_bytes()).hexdigest() != cdigest:
            raise InvalidInput(f"{ref}: the image config does not hash to its digest {cdigest}; refused")
        config = _read_json(cpath, "image config")
    src = Source(kind, ref, digest, config=config)
    for i, layer in enumerate(doc.get("layers") or []):
        mt = layer.get("mediaType", "")
        if mt not in LAYER_TYPES:
            hint = ("zstd layers are not supported yet: re-export with gzip layers" if "zstd" in mt else
                    f"supported layer types: {', '.join(sorted(LAYER_TYPES))}")
            raise InvalidInput(f"layer {i} ({layer.get('digest')}) has unsupported media type {mt!r}", hint=hint)
        p = blob(layer.get("digest", ""), f"layer {i}")
        src.layers.append(Layer(layer["digest"], LAYER_TYPES[mt], lambda p=p: open(p, "rb"), layer["digest"]))
    if not src.layers:
        raise InvalidInput(f"manifest {digest} has no layers")
    return src


def _docker_save(path: Path) -> Source:
    try:
        tar = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise InvalidInput(f"{path} is not a readable tar archive: {exc}") from exc

    def member(name: str, what: str) -> tarfile.TarInfo:
        try:
            m = tar.getmember(name)
        except KeyError:
            raise NotFound(f"{what} {name!r} not found in {path} (the docker save archive is incomplete)",
                           hint="re-run 'docker save IMAGE -o FILE' and copy the whole file") from None
        while m.issym() or m.islnk():  # docker 25+ links legacy layer paths to blobs/sha256/...
            target = m.linkname if m.islnk() else os.path.normpath(os.path.join(os.path.dirname(m.name), m.linkname))
            m = member(target, what)
        if not m.isfile():
            raise InvalidInput(f"{what} {name!r} in {path} is not a regular file")
        return m

    def read(name: str, what: str) -> bytes:
        f = tar.extractfile(member(name, what))
        assert f is not None
        return f.read()

    try:
        manifest = json.loads(read("manifest.json", "manifest.json"))
    except ValueError as exc:
        raise InvalidInput(f"manifest.json in {path} is not JSON: {exc}") from exc
    if not isinstance(manifest, list) or not manifest or "Layers" not in manifest[0]:
        raise InvalidInput(f"manifest.json in {path} is not a docker save manifest (a list of {{Config, Layers}})")
    entry = manifest[0]
    config_raw = read(entry["Config"], "image config") if entry.get("Config") else b"{}"
    digest = "sha256:" + hashlib.sha256(config_raw + json.dumps(entry["Layers"]).encode()).hexdigest()
    src = Source("docker-save", str(path), digest, config=json.loads(config_raw or b"{}"))
    for name in entry["Layers"]:
        m = member(name, "layer")

        def opener(m: tarfile.TarInfo = m) -> IO[bytes]:
            f = tar.extractfile(m)
            assert f is not None
            return f
        src.layers.append(Layer(name, "auto", opener))
    if not src.layers:
        raise InvalidInput(f"{path}: the image has no layers")
    return src


def open_source(ref: str | Path) -> Source:
    p = Path(ref)
    if p.is_dir():
        if not (p / "index.json").exists():
            raise InvalidInput(f"{p} is a directory but not an OCI image layout (no index.json)",
                               hint="export one with 'skopeo copy docker://IMAGE oci:DIR' or pass a 'docker save' tar")
        return _oci_layout(p)
    if p.is_file():
        return _docker_save(p)
    raise NotFound(f"image {ref} not found: pass an OCI layout directory or a 'docker save' tarball",
                   hint=f"to pull from a registry, say so: docker://{str(ref).removeprefix('/')}")


# ---------------------------------------------------------------- safe paths in the rootfs
def _member_name(name: str, layer: str) -> str:
    if name.startswith("/") or "\\" in name and name.startswith("\\"):
        raise UnsafeImage(f"layer {layer}: absolute member path {name!r} refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeImage(f"layer {layer}: member path {name!r} climbs out of the rootfs ('..'); refused")
    return "/".join(parts)


@contextmanager
def _layer_stream(layer: Layer) -> Iterator[IO[bytes]]:
    raw = layer.open()
    try:
        if layer.digest:  # verify the blob before trusting its content
            h = hashlib.sha256()
            for chunk in iter(lambda: raw.read(1 << 20), b""):
                h.update(chunk)
            if "sha256:" + h.hexdigest() != layer.digest:
                raise InvalidInput(f"layer {layer.digest} is corrupt: its content hashes to sha256:{h.hexdigest()}")
            raw.close()
            raw = layer.open()
        comp = layer.compression
        if comp == "auto":
            head = raw.read(2)
            raw.seek(0)
            comp = "gzip" if head == b"\x1f\x8b" else "tar"
        yield gzip.GzipFile(fileobj=raw, mode="rb") if comp == "gzip" else raw  # type: ignore[misc]
    finally:
        raw.close()


@dataclass
class UnpackStats:
    layers: int = 0
    members: int = 0
    whiteouts: int = 0
    opaque: int = 0
    skipped_devices: list[str] = field(default_factory=list)
    setid_stripped: list[str] = field(default_factory=list)  # files the image wanted setuid/setgid


def _apply_layer(tree: Tree, layer: Layer, stats: UnpackStats, as_root: bool) -> None:
    this_layer: set[str] = set()
    try:
        with _layer_stream(layer) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for m in tar:
                _apply_member(tree, layer, tar, m, stats, this_layer, as_root)
    except tarfile.TarError as exc:
        raise InvalidInput(f"layer {layer.name} is not a valid tar archive: {exc}") from exc
    except (IsADirectoryError, NotADirectoryError, FileExistsError, Escape) as exc:
        raise InvalidInput(f"layer {layer.name} does not apply over the layers below it: {exc}") from exc
    except (EOFError, gzip.BadGzipFile) as exc:
        raise InvalidInput(f"layer {layer.name} is truncated or not gzip: {exc}") from exc
    stats.layers += 1


def _apply_member(tree: Tree, layer: Layer, tar: tarfile.TarFile, m: tarfile.TarInfo, stats: UnpackStats,
                  this_layer: set[str], as_root: bool) -> None:
    """One member of a layer onto the rootfs: a whiteout removes what the layers below made, anything else is
    written with its mode (and owner, `as_root`) but never setuid/setgid on the host (see `_set_owner_mode`).
    `this_layer`: the names this layer wrote so far. The parent directory is resolved inside the rootfs and the
    last component is written with the *at calls, never followed."""
    name = _member_name(m.name, layer.name)
    if not name:
        return
    stats.members += 1
    parent_rel, _, base = name.rpartition("/")
    if base.startswith(".wh."):
        _whiteout(tree, layer, name, parent_rel, base, stats, this_layer)
        return
    this_layer.add(name)
    if m.ischr() or m.isblk():
        stats.skipped_devices.append(name)
        return
    with tree.dir(parent_rel, create=True) as d:
        if _write_member(tree, d, layer, tar, m, base, parent_rel, name):
            _set_owner_mode(tree, d, base, m, name, as_root)


def _set_owner_mode(tree: Tree, d: int, base: str, m: tarfile.TarInfo, name: str, as_root: bool) -> None:
    """The member's owner (as root) and mode, without setuid/setgid on anything but a directory: the host copy
    of an image never holds a set-id file (the guest gets no set-id bits either; SECURITY.md says why). The
    bits asked for are recorded in `tree.setid`."""
    mode = m.mode & 0o7777
    if mode & SETID and not m.isdir():
        tree.setid[name] = mode
        mode &= ~SETID
    if m.issym():
        if as_root:
            os.chown(base, m.uid, m.gid, dir_fd=d, follow_symlinks=False)
        return
    fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if m.isfifo() else 0), dir_fd=d)
    try:
        if as_root:
            os.fchown(fd, m.uid, m.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _whiteout(tree: Tree, layer: Layer, name: str, parent_rel: str, base: str, stats: UnpackStats,
              this_layer: set[str]) -> None:
    """`.wh..wh..opq` empties its directory of what the layers below put there; `.wh.NAME` removes NAME."""
    if base == ".wh..wh..opq":
        stats.opaque += 1
        try:
            with tree.dir(parent_rel) as d:
                fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=d)
                try:
                    children = os.listdir(fd)
                finally:
                    os.close(fd)
                for child in children:
                    if f"{parent_rel}/{child}".lstrip("/") not in this_layer:
                        tree.remove_at(d, child)
        except (FileNotFoundError, NotADirectoryError):
            pass
        return
    if base[4:] in ("", ".", ".."):
        raise UnsafeImage(f"layer {layer.name}: malformed whiteout {name!r}")
    stats.whiteouts += 1
    tree.remove(f"{parent_rel}/{base[4:]}")


def _write_member(tree: Tree, d: int, layer: Layer, tar: tarfile.TarFile, m: tarfile.TarInfo, base: str,
                  parent_rel: str, name: str) -> bool:
    """Make `base` in the directory `d` what member `m` is, replacing what was there. False when its mode and
    owner are not its own to set: a hard link (it shares its source's inode) or a kind a rootfs does not hold."""
    if m.isdir():
        try:
            st = os.stat(base, dir_fd=d, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(base, dir_fd=d)
                os.mkdir(base, 0o700, dir_fd=d)
        except FileNotFoundError:
            os.mkdir(base, 0o700, dir_fd=d)
    elif m.issym():
        _refuse_climbing_symlink(tree, layer, parent_rel, name, m.linkname)
        tree.remove_at(d, base)
        os.symlink(m.linkname, base, dir_fd=d)
    elif m.islnk():
        _hard_link(tree, d, layer, base, name, m.linkname)
        return False  # shares the inode (mode, owner) of its source
    elif m.isfifo():
        tree.remove_at(d, base)
        os.mkfifo(base, 0o600, dir_fd=d)
    elif m.isreg():
        tree.remove_at(d, base)
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
        with os.fdopen(fd, "wb") as out:
            src_f = tar.extractfile(m)
            assert src_f is not None
            shutil.copyfileobj(src_f, out, 1 << 20)
    else:
        return False
    return True


def _hard_link(tree: Tree, d: int, layer: Layer, base: str, name: str, linkname: str) -> None:
    """A hard link to another file of the rootfs: its source resolved inside the rootfs (its last component not
    followed), never a directory, never a host file."""
    src_rel = _member_name(linkname, layer.name)
    try:
        with tree.parent(src_rel, create=False) as (sd, sbase):
            st = os.stat(sbase, dir_fd=sd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise FileNotFoundError(sbase)
            tree.remove_at(d, base)
            os.link(sbase, base, src_dir_fd=sd, dst_dir_fd=d, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError, Escape):
        raise UnsafeImage(f"layer {layer.name}: hard link /{name} -> /{src_rel}: no such file") from None


def _refuse_climbing_symlink(tree: Tree, layer: Layer, parent_rel: str, name: str, linkname: str) -> None:
    """A symlink whose target, resolved from where it really is (its parent's symlinks followed inside the
    rootfs, then its own target's), climbs above the rootfs is refused. Defence in depth: forkd itself only ever
    resolves paths inside the rootfs (forkd.image.beneath), so such a link could mislead only a host tool."""
    where = tree.real(parent_rel)
    if where is None:
        raise UnsafeImage(f"layer {layer.name}: symlink /{name}: its directory does not resolve inside the rootfs")
    start = "" if linkname.startswith("/") else ("" if where == "." else where)
    try:
        resolve_in(tree.path, f"{start}/{linkname}", follow_last=True, strict=True)
    except UnsafeImage:
        raise UnsafeImage(f"layer {layer.name}: symlink /{name} -> {linkname} points above the rootfs; "
                          "refused") from None


def unpack(src: Source, root: Path, progress: Progress = lambda s: None) -> UnpackStats:
    """Unpack every layer of `src`, in order, into the (new) directory `root`."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    stats = UnpackStats()
    as_root = os.geteuid() == 0
    with Tree(root) as tree:
        for i, layer in enumerate(src.layers):
            progress(f"unpacking layer {i + 1}/{len(src.layers)} ({layer.name[:19]})")
            _apply_layer(tree, layer, stats, as_root)
        stats.setid_stripped = sorted(tree.setid)
    return stats


def layer_tar(entries: list[tuple[str, bytes | str | None, int]]) -> bytes:
    """A small helper for tests and tools: an uncompressed tar of (name, content|symlink-target|None=dir, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            if content is None:
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            elif isinstance(content, str):
                ti.type = tarfile.SYMTYPE
                ti.linkname = content
                tar.addfile(ti)
            else:
                ti.size = len(content)
                tar.addfile(ti, io.BytesIO(content))
    return buf.getvalue()
