"""Guest images from container images, without a container engine: an OCI image layout directory
(index.json -> manifest -> layer blobs) or a `docker save` tarball (manifest.json + layer tars).

The layers are unpacked in order into a rootfs directory, honouring whiteouts (`.wh.NAME` deletes NAME from
lower layers, `.wh..wh..opq` hides a directory's lower content). Member paths are resolved inside the rootfs
like a chroot would (absolute symlinks point into the rootfs, `..` stops at its top), so nothing is ever
written outside it; absolute or `..` member names, hard links to outside and relative symlinks climbing
above the root are refused; device nodes are skipped (the guest has devtmpfs).

forkd's init, agent, a static busybox (for init, and /bin/sh if the image has none) and the kernel's virtio
modules are injected; the image's own python3 (>= 3.8) runs the agent. The rootfs is packed as an
uncompressed initramfs (it lives in guest RAM, shared copy-on-write by the children) into a content-addressed
image directory like the default image's, with image.json saying where it came from.
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
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from forkd.base.atomic import write_json
from forkd.base.errors import ForkdError, InvalidInput, NotFound
from forkd.base.hashing import sha256_file
from forkd.base.paths import Layout
from forkd.image import debs
from forkd.image.build import BUSYBOX_PACKAGE, GUEST_DIR, GUEST_SOURCES, Image, take_kernel, write_initramfs

OCI_BUILDER_VERSION = "1"
MIB = 1 << 20
# an initramfs is unpacked into guest RAM at boot; past this a disk-backed rootfs is the way (not built yet)
INITRAMFS_MAX_BYTES = 2048 * MIB
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
PYTHON_CANDIDATES = ["usr/local/bin/python3", "usr/bin/python3", "bin/python3"]
MIN_PYTHON = (3, 8)

Progress = Callable[[str], None]


class UnsafeImage(InvalidInput):
    """A layer that would write outside the rootfs (or otherwise cannot be unpacked safely)."""


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
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
        raise InvalidInput(f"{what} has an unsupported or malformed digest {digest!r} (only sha256 is supported)")
    p = root / "blobs" / "sha256" / hexd
    if not p.is_file():
        raise NotFound(f"{what} blob {digest} not found: {p} is missing (the OCI layout is incomplete)",
                       hint="re-export the image with all its layers (e.g. skopeo copy ... oci:DIR)")
    return p


def _read_json(p: Path, what: str) -> dict:
    try:
        return json.loads(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{what} ({p}) is missing or not JSON: {exc}") from exc


def _pick_manifest(entries: list[dict], where: str) -> dict:
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
    index = _read_json(root / "index.json", "the OCI layout's index.json")
    desc = _pick_manifest(index.get("manifests") or [], f"{root}/index.json")
    for _ in range(4):  # an index may point at a nested index (e.g. buildx output)
        mt = desc.get("mediaType", "")
        blob = _blob_path(root, desc.get("digest", ""), "manifest")
        doc = _read_json(blob, f"manifest {desc.get('digest')}")
        mt = mt or doc.get("mediaType", "")
        if mt in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
            desc = _pick_manifest(doc.get("manifests") or [], f"index {desc.get('digest')}")
            continue
        if mt and mt not in MANIFEST_TYPES:
            raise InvalidInput(f"manifest {desc.get('digest')} has unsupported media type {mt!r}",
                               hint=f"supported: {', '.join(sorted(MANIFEST_TYPES))}")
        break
    else:
        raise InvalidInput(f"{root}: indexes nest too deeply")
    config = {}
    if doc.get("config", {}).get("digest"):
        config = _read_json(_blob_path(root, doc["config"]["digest"], "config"), "image config")
    src = Source("oci-layout", str(root), desc["digest"], config=config)
    for i, layer in enumerate(doc.get("layers") or []):
        mt = layer.get("mediaType", "")
        if mt not in LAYER_TYPES:
            hint = ("zstd layers are not supported yet: re-export with gzip layers" if "zstd" in mt else
                    f"supported layer types: {', '.join(sorted(LAYER_TYPES))}")
            raise InvalidInput(f"layer {i} ({layer.get('digest')}) has unsupported media type {mt!r}", hint=hint)
        p = _blob_path(root, layer.get("digest", ""), f"layer {i}")
        src.layers.append(Layer(layer["digest"], LAYER_TYPES[mt], lambda p=p: open(p, "rb"), layer["digest"]))
    if not src.layers:
        raise InvalidInput(f"manifest {desc['digest']} has no layers")
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
                   hint="registry references (docker.io/...) are not pulled: this host has no registry access")


# ---------------------------------------------------------------- safe paths in the rootfs
def resolve_in(root: Path, rel: str, follow_last: bool = False) -> Path:
    """`rel` resolved inside `root` as if `root` were `/`: symlinks are followed within it (absolute ones
    relative to it), `..` stops at it. The result is always under `root`."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    cur: list[str] = []
    hops = 0
    while parts:
        comp = parts.pop(0)
        if comp == "..":
            if cur:
                cur.pop()
            continue
        p = os.path.join(root, *cur, comp)
        if (parts or follow_last) and os.path.islink(p):
            hops += 1
            if hops > 40:
                raise UnsafeImage(f"too many levels of symbolic links resolving /{rel}")
            target = os.readlink(p)
            if target.startswith("/"):
                cur = []
            parts = [x for x in target.split("/") if x not in ("", ".")] + parts
            continue
        cur.append(comp)
    return Path(root, *cur)


def _member_name(name: str, layer: str) -> str:
    if name.startswith("/") or "\\" in name and name.startswith("\\"):
        raise UnsafeImage(f"layer {layer}: absolute member path {name!r} refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeImage(f"layer {layer}: member path {name!r} climbs out of the rootfs ('..'); refused")
    return "/".join(parts)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        p.unlink()


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


def _apply_layer(root: Path, layer: Layer, stats: UnpackStats, as_root: bool) -> None:
    this_layer: set[str] = set()
    try:
        with _layer_stream(layer) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for m in tar:
                name = _member_name(m.name, layer.name)
                if not name:
                    continue
                stats.members += 1
                parent_rel, _, base = name.rpartition("/")
                parent = resolve_in(root, parent_rel, follow_last=True)
                if base == ".wh..wh..opq":
                    stats.opaque += 1
                    if parent.is_dir():
                        for child in parent.iterdir():
                            if f"{parent_rel}/{child.name}".lstrip("/") not in this_layer:
                                _remove(child)
                    continue
                if base.startswith(".wh."):
                    if base[4:] in ("", ".", ".."):
                        raise UnsafeImage(f"layer {layer.name}: malformed whiteout {name!r}")
                    stats.whiteouts += 1
                    _remove(parent / base[4:])
                    continue
                this_layer.add(name)
                if m.ischr() or m.isblk():
                    stats.skipped_devices.append(name)
                    continue
                parent.mkdir(parents=True, exist_ok=True)
                target = parent / base
                if m.isdir():
                    if os.path.lexists(target) and not (target.is_dir() and not target.is_symlink()):
                        target.unlink()
                    target.mkdir(exist_ok=True)
                elif m.issym():
                    if not m.linkname.startswith("/"):  # absolute targets resolve inside the guest's root
                        depth = 0
                        for comp in os.path.join(parent_rel, m.linkname).split("/"):
                            depth += -1 if comp == ".." else (0 if comp in ("", ".") else 1)
                            if depth < 0:
                                raise UnsafeImage(f"layer {layer.name}: symlink /{name} -> {m.linkname} points "
                                                  f"above the rootfs; refused")
                    _remove(target)
                    os.symlink(m.linkname, target)
                elif m.islnk():
                    src_rel = _member_name(m.linkname, layer.name)
                    src = resolve_in(root, src_rel)
                    if not os.path.lexists(src) or src.is_dir():
                        raise UnsafeImage(f"layer {layer.name}: hard link /{name} -> /{src_rel}: no such file")
                    _remove(target)
                    os.link(src, target, follow_symlinks=False)
                    continue  # shares the inode (mode, owner) of its source
                elif m.isfifo():
                    _remove(target)
                    os.mkfifo(target)
                elif m.isreg():
                    _remove(target)
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        src_f = tar.extractfile(m)
                        assert src_f is not None
                        shutil.copyfileobj(src_f, out, 1 << 20)
                else:
                    continue
                if as_root:
                    os.lchown(target, m.uid, m.gid)
                if not m.issym():
                    os.chmod(target, m.mode & 0o7777)
    except tarfile.TarError as exc:
        raise InvalidInput(f"layer {layer.name} is not a valid tar archive: {exc}") from exc
    except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
        raise InvalidInput(f"layer {layer.name} does not apply over the layers below it: {exc}") from exc
    except (EOFError, gzip.BadGzipFile) as exc:
        raise InvalidInput(f"layer {layer.name} is truncated or not gzip: {exc}") from exc
    stats.layers += 1


def unpack(src: Source, root: Path, progress: Progress = lambda s: None) -> UnpackStats:
    """Unpack every layer of `src`, in order, into the (new) directory `root`."""
    root.mkdir(parents=True, exist_ok=True)
    stats = UnpackStats()
    as_root = os.geteuid() == 0
    for i, layer in enumerate(src.layers):
        progress(f"unpacking layer {i + 1}/{len(src.layers)} ({layer.name[:19]})")
        _apply_layer(root, layer, stats, as_root)
    return stats


# ---------------------------------------------------------------- guest parts
@dataclass(frozen=True)
class GuestPython:
    path: str             # in the guest, e.g. /usr/local/bin/python3
    version: tuple[int, int]
    site_dir: str | None  # a directory on its sys.path for extra packages (.pth), when found


def find_python(root: Path) -> GuestPython:
    for cand in PYTHON_CANDIDATES:
        real = resolve_in(root, cand, follow_last=True)
        if not real.is_file():
            continue
        prefix = "/" + cand.rsplit("/bin/", 1)[0] if "/bin/" in cand else ""
        version = None
        m = re.fullmatch(r"python(\d+)\.(\d+)", real.name)
        if m:
            version = (int(m[1]), int(m[2]))
        else:
            for lib in sorted(resolve_in(root, f"{prefix}/lib").glob("python3.*/os.py")):
                m = re.fullmatch(r"python(\d+)\.(\d+)", lib.parent.name)
                if m:
                    version = (int(m[1]), int(m[2]))
        if version is None:
            raise InvalidInput(f"found /{cand} in the image but cannot tell its version (no {prefix}/lib/python3.N)")
        if version < MIN_PYTHON:
            raise InvalidInput(f"the image's /{cand} is Python {version[0]}.{version[1]}; forkd's agent needs "
                               f">= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}", hint="use a newer python base image")
        v = f"{version[0]}.{version[1]}"
        site = None
        for s in [f"{prefix}/lib/python{v}/site-packages", "/usr/lib/python3/dist-packages",
                  f"/usr/local/lib/python{v}/dist-packages", f"{prefix}/lib/python{v}/dist-packages"]:
            if resolve_in(root, s, follow_last=True).is_dir():
                site = s
                break
        return GuestPython("/" + cand, version, site)
    raise InvalidInput("no python3 in the image (looked for /" + ", /".join(PYTHON_CANDIDATES) + "): forkd's "
                       "agent runs on the image's own Python (>= 3.8, stdlib only)",
                       hint="start from an image with Python (e.g. python:3.11-slim, or debian + python3), or "
                            "use the Debian path: forkd image build --debian-packages ...")


def guest_init(python: str) -> str:
    """forkd's init.sh, run by the injected busybox, exec'ing the image's python for the agent."""
    src = (GUEST_DIR / "init.sh").read_text()
    lines = src.splitlines()
    if lines and lines[0].startswith("#!"):
        lines[0] = "#!/forkd/bin/busybox sh"
    text = "\n".join(lines) + "\n"
    # init's own commands: busybox first (the image may lack insmod, ip, ...); the agent gets the image's PATH
    text, n = re.subn(r"^export PATH=(\S+)", r"export PATH=/forkd/bin:\1", text, count=1, flags=re.M)
    agent_path = "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/forkd/bin"
    text, k = re.subn(r"^exec \S+python\S* (.*/forkd/agent\.py.*)$", lambda m: f"{agent_path}\nexec {python} "
                      f"{m[1]}", text, count=1, flags=re.M)
    if n != 1 or k != 1:
        raise ForkdError("forkd/guest/init.sh no longer has the PATH / exec-agent lines the OCI builder rewrites",
                         hint="update forkd.image.oci.guest_init")
    return text


def _busybox(layout: Layout, stage: Path) -> Path:
    deb = debs.download(layout.debs, BUSYBOX_PACKAGE)
    debs.extract(deb, stage / "busybox")
    return stage / "busybox" / "bin" / "busybox"


def inject(layout: Layout, root: Path, python: GuestPython, stage: Path, kernel_out: Path) -> str:
    """Put forkd's init, agent, busybox and the kernel's virtio modules into `root`; write the kernel to
    `kernel_out`. Returns the kernel package name."""
    for rel in ["init", "forkd"]:
        _remove(root / rel)
    fb = root / "forkd" / "bin"
    fb.mkdir(parents=True)
    bb = _busybox(layout, stage)
    shutil.copy2(bb, fb / "busybox")
    applets = subprocess.run([str(bb), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        if a != "busybox":
            os.symlink("busybox", fb / a)
    sh = resolve_in(root, "bin/sh", follow_last=True)
    if not sh.exists():
        binp = resolve_in(root, "bin", follow_last=True)
        binp.mkdir(parents=True, exist_ok=True)
        _remove(binp / "sh")
        os.symlink("/forkd/bin/busybox", binp / "sh")
    shutil.copy2(GUEST_DIR / "agent.py", root / "forkd" / "agent.py")
    (root / "init").write_text(guest_init(python.path))
    os.chmod(root / "init", 0o755)
    for d, mode in [("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("tmp", 0o1777), ("root", 0o700),
                    ("run", 0o755), ("etc", 0o755)]:
        p = resolve_in(root, d, follow_last=True)
        if not p.exists():
            p.mkdir(parents=True)
            os.chmod(p, mode)
    for f, text in [("etc/hostname", "forkd\n"), ("etc/hosts", "127.0.0.1 localhost\n"),
                    ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")]:
        p = resolve_in(root, f, follow_last=True)
        if not p.exists():
            p.write_text(text)
    mods = resolve_in(root, "lib/modules/forkd", follow_last=True)
    mods.mkdir(parents=True, exist_ok=True)
    kdeb = debs.kernel_package(layout.debs)
    debs.extract(kdeb, stage / "kernel")
    take_kernel(stage / "kernel", kdeb.name, kernel_out, mods)
    return kdeb.name


def pip_install(root: Path, python: GuestPython, packages: list[str], progress: Progress) -> list[str]:
    """Install wheels for the guest's Python into the rootfs, from the host: `pip install --target` with the
    guest's version and platform, wheels only (no package code runs on the host, none needs the guest's
    network). The directory is put on the guest's sys.path with a .pth file. Returns the installed dists."""
    if not packages:
        return []
    if python.site_dir is None:
        raise InvalidInput(f"--pip: found no site-packages directory for the image's {python.path}",
                           hint="install the packages in the image instead (e.g. a Dockerfile RUN pip install)")
    v = f"{python.version[0]}{python.version[1]}"
    musl = any(resolve_in(root, "lib").glob("ld-musl-*.so.1"))
    plats = (["musllinux_1_1_x86_64", "musllinux_1_2_x86_64"] if musl else
             ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64"])
    target = root / "forkd" / "site-packages"
    argv = [os.environ.get("FORKD_HOST_PYTHON", "python3"), "-m", "pip", "install", "-q", "--no-compile",
            "--disable-pip-version-check", "--target", str(target), "--only-binary=:all:",
            "--implementation", "cp", "--python-version", f"{python.version[0]}.{python.version[1]}",
            "--abi", f"cp{v}", "--abi", "abi3", "--abi", "none"]
    for p in plats:
        argv += ["--platform", p]
    progress(f"pip: installing wheels for Python {python.version[0]}.{python.version[1]} into the rootfs")
    res = subprocess.run(argv + list(packages), capture_output=True, text=True)
    if res.returncode != 0:
        raise ForkdError(f"--pip {' '.join(packages)}: pip failed on the host: {res.stderr.strip()[-600:]}",
                         hint="only packages with wheels (--only-binary) for this Python/platform can be "
                              "installed; the guest has no network at build time")
    site = resolve_in(root, python.site_dir, follow_last=True)
    (site / "forkd-pip.pth").write_text("/forkd/site-packages\n")
    return sorted(p.name for p in target.glob("*.dist-info"))


def tree_bytes(root: Path) -> int:
    """Bytes the rootfs takes once unpacked (regular files, each inode once, plus a little per entry)."""
    total, seen = 0, set()
    for dirpath, dirnames, filenames in os.walk(root):
        total += 4096
        for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            st = os.lstat(os.path.join(dirpath, n))
            if stat.S_ISREG(st.st_mode) and (st.st_ino not in seen):
                seen.add(st.st_ino)
                total += st.st_size
            else:
                total += 512
    return total


def min_memory_mib(rootfs_bytes: int) -> int:
    """Guest RAM an initramfs of this size needs: 2.5 x the unpacked rootfs (archive + unpacked files +
    page cache churn at boot) plus 256 MiB for the kernel and the running agent, rounded up to 64 MiB."""
    need = int(2.5 * rootfs_bytes) + 256 * MIB
    return -(-(need + 1) // (64 * MIB)) * 64


def check_fits(rootfs_bytes: int, memory_mib: int | None, what: str) -> None:
    if rootfs_bytes > INITRAMFS_MAX_BYTES:
        raise ForkdError(f"{what}: the rootfs unpacks to {rootfs_bytes // MIB} MiB, more than an initramfs can "
                         f"hold ({INITRAMFS_MAX_BYTES // MIB} MiB); a disk-backed rootfs (ext4 + per-child "
                         "copy-on-write overlay) is NotImplemented yet",
                         hint="slim the image (multi-stage build, drop docs/caches) to fit an initramfs")
    if memory_mib is not None and memory_mib * MIB <= 2.5 * rootfs_bytes + 256 * MIB:
        need = min_memory_mib(rootfs_bytes)
        raise InvalidInput(f"{what}: the rootfs unpacks to {rootfs_bytes / MIB:.0f} MiB and an initramfs lives in "
                           f"guest RAM, so {memory_mib} MiB is too small (needs > 2.5 x rootfs + 256 MiB)",
                           hint=f"set --memory-mib {need} (memoryMiB: {need} in a ForkParent) or more")


# ---------------------------------------------------------------- assembling an image directory
def guest_sources_hash() -> str:
    h = hashlib.sha256()
    for src in GUEST_SOURCES:
        h.update(src.encode() + b"\0" + (GUEST_DIR / src).read_bytes())
    return h.hexdigest()


def finish(layout: Layout, image_id: str, root: Path, out: Path, meta: dict, memory_mib: int | None,
           progress: Progress) -> Image:
    """Pack `root` into out/initrd.img (out/vmlinuz is written already), check it fits `memory_mib`, write
    image.json and move `out` to images/<image_id> atomically. Nothing is registered if any step fails."""
    rootfs_bytes = tree_bytes(root)
    check_fits(rootfs_bytes, memory_mib, f"image {meta.get('source', {}).get('ref', image_id)}")
    progress(f"writing the initramfs (cpio, {rootfs_bytes / MIB:.0f} MiB)")
    write_initramfs(root, out / "initrd.img")
    meta = dict(meta, id=image_id, kernel_sha256=sha256_file(out / "vmlinuz"),
                initrd_sha256=sha256_file(out / "initrd.img"), initrd_bytes=(out / "initrd.img").stat().st_size,
                rootfs_bytes=rootfs_bytes, min_memory_mib=min_memory_mib(rootfs_bytes), built_at=time.time())
    write_json(out / "image.json", meta)
    for f in out.iterdir():
        os.chmod(f, 0o444)
    final = layout.images / image_id
    if final.exists():
        shutil.rmtree(final)
    os.rename(out, final)
    return Image.load(final)


def cached_image(layout: Layout, image_id: str, memory_mib: int | None) -> Image | None:
    d = layout.images / image_id
    if not (d / "image.json").exists():
        return None
    img = Image.load(d)
    check_fits(int(img.meta.get("rootfs_bytes", 0)), memory_mib, f"image {image_id}")
    return img


def from_image(layout: Layout, ref: str | Path, memory_mib: int | None = None, pip: tuple[str, ...] = (),
               progress: Progress = lambda s: None, force: bool = False) -> tuple[Image, bool]:
    """Build (or find in the cache) the guest image for an OCI layout / docker save tarball.
    Returns (image, built_now)."""
    layout.ensure()
    src = open_source(ref)
    kdeb = debs.kernel_package(layout.debs)
    bdeb = debs.download(layout.debs, BUSYBOX_PACKAGE)
    h = hashlib.sha256(f"forkd-oci-image {OCI_BUILDER_VERSION}\n{src.digest}\n{kdeb.name}\n{bdeb.name}\n"
                       f"{guest_sources_hash()}\npip={json.dumps(sorted(pip))}\n".encode())
    image_id = "oci-" + h.hexdigest()[:16]
    hit = None if force else cached_image(layout, image_id, memory_mib)
    if hit is not None:
        return hit, False
    t0 = time.monotonic()
    work = layout.tmp / f"oci-{image_id}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        root, out, stage = work / "root", work / "out", work / "stage"
        out.mkdir(parents=True)
        stage.mkdir()
        stats = unpack(src, root, progress)
        python = find_python(root)
        progress(f"found Python {python.version[0]}.{python.version[1]} at {python.path}; injecting forkd's "
                 "init, agent, busybox and virtio modules")
        kname = inject(layout, root, python, stage, out / "vmlinuz")
        installed = pip_install(root, python, list(pip), progress)
        meta = {"kind": "oci", "builder_version": OCI_BUILDER_VERSION,
                "source": {"kind": src.kind, "ref": str(Path(ref).absolute()), "digest": src.digest,
                           "layers": [la.name for la in src.layers]},
                "python": {"path": python.path, "version": f"{python.version[0]}.{python.version[1]}"},
                "pip": {"requested": sorted(pip), "installed": installed},
                "packages": {"kernel": kname, "busybox": bdeb.name},
                "unpack": {"members": stats.members, "whiteouts": stats.whiteouts, "opaque": stats.opaque,
                           "skipped_devices": len(stats.skipped_devices)},
                "build_seconds": 0.0}
        meta["build_seconds"] = round(time.monotonic() - t0, 2)
        img = finish(layout, image_id, root, out, meta, memory_mib, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return img, True


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
