"""Turning an unpacked rootfs into a forkd guest image, whatever it came from (an OCI image, a Debian package
set): find its Python, inject forkd's init, agent, busybox and the kernel's virtio modules, install wheels, and
write the content-addressed image in one of two shapes:

* `initramfs`: the whole rootfs is an uncompressed initramfs, unpacked into guest RAM at boot (which children
  share copy-on-write); it must fit the parent's memory size;
* `disk`: the rootfs is a raw ext4 file (`mkfs.ext4 -d`, 0444) plus a small stage-1 initramfs (busybox, the
  virtio modules, forkd/guest/boot.sh) that mounts it and switches to it. Parents and children write only
  qcow2 overlays on it (forkd.vmm.disk), so no two children share a writable disk.

`auto` picks `disk` for a rootfs over AUTO_DISK_BYTES, `initramfs` below.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from forkd.base.atomic import rename_into_place, write_json
from forkd.base.errors import ForkdError, InvalidInput
from forkd.base.hashing import sha256_file
from forkd.base.mounts import remove_tree
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import make_private_dir
from forkd.base.procs import run
from forkd.base.settings import settings
from forkd.guest import AGENT_MODULES
from forkd.image import debs
from forkd.image.beneath import Tree
from forkd.image.build import BUSYBOX_PACKAGE, GUEST_DIR, GUEST_SOURCES, Image, take_kernel, write_initramfs
from forkd.image.pycheck import check_agent_modules

MIB = 1 << 20
# an initramfs is unpacked into guest RAM at boot; past this only a disk-backed rootfs will do
INITRAMFS_MAX_BYTES = 2048 * MIB
AUTO_DISK_BYTES = 1024 * MIB  # rootfs: auto goes to disk above this
ROOTFS_KINDS = ("auto", "initramfs", "disk")
DISK_MIN_MEMORY_MIB = 192  # a disk-backed guest needs RAM for the kernel, the agent and some page cache only
DISK_FREE_BYTES = 512 * MIB  # free space in the ext4 for what guests write (a sparse file: costs nothing)
PYTHON_CANDIDATES = ["usr/local/bin/python3", "usr/bin/python3", "bin/python3"]
MIN_PYTHON = (3, 8)
Progress = Callable[[str], None]


class UnsafeImage(InvalidInput):
    """A layer that would write outside the rootfs (or otherwise cannot be unpacked safely)."""


def resolve_in(root: Path, rel: str, follow_last: bool = False, strict: bool = False) -> Path:
    """`rel` resolved inside `root` as if `root` were `/`: symlinks are followed within it (absolute ones
    relative to it), `..` stops at it (with `strict`: a `..` above it raises UnsafeImage). The result is always
    under `root`. For reading only: writers go through forkd.image.beneath.Tree."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    cur: list[str] = []
    hops = 0
    while parts:
        comp = parts.pop(0)
        if comp == "..":
            if cur:
                cur.pop()
            elif strict:
                raise UnsafeImage(f"/{rel} climbs above the rootfs")
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


@contextmanager
def workspace(layout: Layout, image_id: str) -> Iterator[tuple[Path, Path, Path]]:
    """A scratch directory for one image build: (root, out, stage), removed afterwards whatever happens. It is
    private: made by mkdtemp (0700, a new unguessable name, never one that existed), so no other user reaches
    anything the image put in `root` (setuid files, world-writable directories ...) while it is built."""
    layout.tmp.mkdir(parents=True, exist_ok=True)
    work = make_private_dir(layout.tmp / owned_name(image_id))  # owned (forkd.base.owners)
    try:
        root, out, stage = work / "root", work / "out", work / "stage"
        for d in (root, out, stage):
            d.mkdir(mode=0o700)
        os.chmod(root, 0o755)  # the guest's / (inside the private work directory)
        os.chmod(out, 0o755)  # becomes images/<id>: as readable as before (an unprivileged VMM reads it)
        yield root, out, stage
    finally:  # never through a mount a killed mmdebstrap left in root/ (forkd.base.mounts); gc retries what stays
        with contextlib.suppress(OSError):  # the build's own error, if any, is the one to report
            remove_tree(work)


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
            libdir = resolve_in(root, f"{prefix}/lib", follow_last=True)
            names = sorted(os.listdir(libdir)) if libdir.is_dir() else []
            for name in names:  # each python3.N/os.py resolved inside the rootfs, not by the host's glob
                m = re.fullmatch(r"python(3)\.(\d+)", name)
                if m and resolve_in(root, f"{prefix}/lib/{name}/os.py", follow_last=True).is_file():
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
        stdlib = resolve_in(root, f"{prefix}/lib/python{v}", follow_last=True)
        check_agent_modules(stdlib, "/" + cand, version)
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
    `kernel_out`. Returns the kernel package name. Every write resolves inside `root` (forkd.image.beneath):
    the image's symlinks never carry one outside."""
    bb = _busybox(layout, stage)
    applets = run([bb, "--list"], "listing busybox applets").stdout.split()
    kdeb = debs.kernel_package(layout.debs)
    debs.extract(kdeb, stage / "kernel")
    (stage / "modules").mkdir(exist_ok=True)
    take_kernel(stage / "kernel", kdeb.name, kernel_out, stage / "modules")
    with Tree(root) as t:
        for rel in ["init", "forkd", "lib/modules/forkd"]:
            t.remove(rel)
        t.makedirs("forkd/bin")
        t.copy_in("forkd/bin/busybox", bb, 0o755)
        for a in applets:
            if a != "busybox":
                t.symlink(f"forkd/bin/{a}", "busybox")
        if t.lookup("bin/sh") is None:
            t.makedirs("bin")
            t.symlink("bin/sh", "/forkd/bin/busybox")
        for name in AGENT_MODULES:
            t.copy_in(f"forkd/{name}", GUEST_DIR / name, 0o644)
        t.write("init", guest_init(python.path), 0o755)
        for d, mode in [("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("tmp", 0o1777), ("root", 0o700),
                        ("run", 0o755), ("etc", 0o755)]:
            if t.lookup(d) is None:
                t.makedirs(d, mode)
        for f, text in [("etc/hostname", "forkd\n"), ("etc/hosts", "127.0.0.1 localhost\n"),
                        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")]:
            if t.lookup(f) is None:
                t.write(f, text)
        t.makedirs("lib/modules/forkd")
        for ko in sorted((stage / "modules").glob("*.ko")):
            t.copy_in(f"lib/modules/forkd/{ko.name}", ko, 0o644)
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
    musl = any(resolve_in(root, "lib", follow_last=True).glob("ld-musl-*.so.1"))
    plats = (["musllinux_1_1_x86_64", "musllinux_1_2_x86_64"] if musl else
             ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64"])
    with Tree(root) as t:  # forkd/ was made by inject; pip writes into a fresh directory of ours
        t.remove("forkd/site-packages")
        t.makedirs("forkd/site-packages")
    target = root / "forkd" / "site-packages"
    argv = [settings().host_python, "-m", "pip", "install", "-q", "--no-compile",
            "--disable-pip-version-check", "--target", str(target), "--only-binary=:all:",
            "--implementation", "cp", "--python-version", f"{python.version[0]}.{python.version[1]}",
            "--abi", f"cp{v}", "--abi", "abi3", "--abi", "none"]
    for p in plats:
        argv += ["--platform", p]
    progress(f"pip: installing wheels for Python {python.version[0]}.{python.version[1]} into the rootfs")
    run(argv + list(packages), f"--pip {' '.join(packages)}: pip on the host",
        hint="only packages with wheels (--only-binary) for this Python/platform can be installed; the guest has no "
             "network at build time")
    write_pth(root, python.site_dir)
    return sorted(p.name for p in target.glob("*.dist-info"))


def write_pth(root: Path, site_dir: str) -> None:
    """forkd-pip.pth in the guest's site directory, resolved inside the rootfs; whatever the image put at that
    name (a symlink to a host file ...) is replaced, never written through."""
    with Tree(root) as t:
        t.write(f"{site_dir}/forkd-pip.pth", "/forkd/site-packages\n")


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


def check_rootfs_kind(kind: str) -> str:
    if kind not in ROOTFS_KINDS:
        raise InvalidInput(f"rootfs {kind!r}: use one of {', '.join(ROOTFS_KINDS)}")
    return kind


class TooSmall(InvalidInput):
    """The guest RAM asked for cannot hold this image's rootfs (as an initramfs) or even a disk-backed guest."""


def choose_kind(kind: str, rootfs_bytes: int, memory_mib: int | None = None) -> str:
    """`auto` resolved by size (see the module docstring): `disk` too when an initramfs would not fit
    `memory_mib` of guest RAM."""
    if kind == "auto":
        fits = memory_mib is None or memory_mib * MIB > 2.5 * rootfs_bytes + 256 * MIB
        return "disk" if rootfs_bytes > AUTO_DISK_BYTES or not fits else "initramfs"
    return kind


def check_fits(rootfs_bytes: int, memory_mib: int | None, what: str, kind: str = "initramfs") -> None:
    if kind == "disk":
        if memory_mib is not None and memory_mib < DISK_MIN_MEMORY_MIB:
            raise TooSmall(f"{what}: {memory_mib} MiB of guest RAM is too small even for a disk-backed rootfs",
                               hint=f"set --memory-mib {DISK_MIN_MEMORY_MIB} or more")
        return
    if rootfs_bytes > INITRAMFS_MAX_BYTES:
        raise InvalidInput(f"{what}: the rootfs unpacks to {rootfs_bytes // MIB} MiB, more than an initramfs can "
                           f"hold ({INITRAMFS_MAX_BYTES // MIB} MiB)",
                           hint="build it disk-backed: --rootfs disk (or auto), image: {oci: {ref: ..., rootfs: "
                                "disk}} in a ForkParent")
    if memory_mib is not None and memory_mib * MIB <= 2.5 * rootfs_bytes + 256 * MIB:
        need = min_memory_mib(rootfs_bytes)
        raise TooSmall(f"{what}: the rootfs unpacks to {rootfs_bytes / MIB:.0f} MiB and an initramfs lives in "
                           f"guest RAM, so {memory_mib} MiB is too small (needs > 2.5 x rootfs + 256 MiB)",
                           hint=f"set --memory-mib {need} (memoryMiB: {need} in a ForkParent) or more, or build "
                                "the image disk-backed (--rootfs disk; rootfs: disk in the image spec)")


def disk_bytes(rootfs_bytes: int) -> int:
    """Size of the ext4 file: the rootfs plus 25 % for file system overhead plus DISK_FREE_BYTES, in 64 MiB."""
    need = int(rootfs_bytes * 1.25) + DISK_FREE_BYTES
    return -(-need // (64 * MIB)) * 64 * MIB


def write_disk(root: Path, out: Path, size: int) -> None:
    """The rootfs as a raw ext4 file (no journal: guests' writes only ever land in throw-away overlays or in a
    snapshot taken while the guest is paused)."""
    run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-L", "forkd-root", "-E", "root_owner=0:0", "-d", root, out,
         f"{size // 1024}k"], "writing the root disk (mkfs.ext4)", hint="apt-get install e2fsprogs")


def write_boot_initramfs(root: Path, stage: Path, out: Path) -> None:
    """The stage-1 initramfs of a disk-backed image: busybox, the virtio modules and boot.sh as /init."""
    boot = stage / "boot"
    shutil.rmtree(boot, ignore_errors=True)
    for d in ("bin", "lib/modules/forkd", "proc", "sys", "dev", "newroot"):
        (boot / d).mkdir(parents=True)
    # forkd's own files from the stage, never from the rootfs (whose names the image may have made symlinks)
    shutil.copy2(stage / "busybox" / "bin" / "busybox", boot / "bin" / "busybox")
    for ko in (stage / "modules").glob("*.ko"):
        shutil.copy2(ko, boot / "lib" / "modules" / "forkd" / ko.name)
    shutil.copy2(GUEST_DIR / "boot.sh", boot / "init")
    os.chmod(boot / "init", 0o755)
    write_initramfs(boot, out)
    shutil.rmtree(boot)


# ---------------------------------------------------------------- assembling an image directory
def guest_sources_hash() -> str:
    h = hashlib.sha256()
    for src in GUEST_SOURCES:
        h.update(src.encode() + b"\0" + (GUEST_DIR / src).read_bytes())
    return h.hexdigest()


def finish(layout: Layout, image_id: str, root: Path, out: Path, meta: dict, memory_mib: int | None,
           progress: Progress, rootfs: str = "auto") -> Image:
    """Pack `root` as an initramfs (out/initrd.img) or as a disk (out/rootfs.ext4 + a stage-1 out/initrd.img),
    check it fits `memory_mib`, write image.json and move `out` to images/<image_id> atomically (out/vmlinuz is
    written already). Nothing is registered if any step fails."""
    rootfs_bytes = tree_bytes(root)
    kind = choose_kind(check_rootfs_kind(rootfs), rootfs_bytes, memory_mib)
    check_fits(rootfs_bytes, memory_mib, f"image {meta.get('source', {}).get('ref', image_id)}", kind)
    extra: dict = {"rootfs": kind}
    if kind == "disk":
        size = disk_bytes(rootfs_bytes)
        progress(f"writing the root disk (ext4, {rootfs_bytes / MIB:.0f} MiB of files in {size // MIB} MiB)")
        write_disk(root, out / "rootfs.ext4", size)
        write_boot_initramfs(root, out.parent / "stage", out / "initrd.img")
        extra.update(disk_bytes=size, disk_sha256=sha256_file(out / "rootfs.ext4"), min_memory_mib=DISK_MIN_MEMORY_MIB)
    else:
        progress(f"writing the initramfs (cpio, {rootfs_bytes / MIB:.0f} MiB)")
        write_initramfs(root, out / "initrd.img")
        extra["min_memory_mib"] = min_memory_mib(rootfs_bytes)
    meta = dict(meta, id=image_id, kernel_sha256=sha256_file(out / "vmlinuz"),
                initrd_sha256=sha256_file(out / "initrd.img"), initrd_bytes=(out / "initrd.img").stat().st_size,
                rootfs_bytes=rootfs_bytes, built_at=time.time(), **extra)
    write_json(out / "image.json", meta)
    for f in out.iterdir():
        os.chmod(f, 0o444)
    final = layout.images / image_id
    if final.exists():
        shutil.rmtree(final)
    rename_into_place(out, final)
    return Image.load(final)


def cached_image(layout: Layout, image_id: str, memory_mib: int | None) -> Image | None:
    d = layout.images / image_id
    if not (d / "image.json").exists():
        return None
    img = Image.load(d)
    check_fits(int(img.meta.get("rootfs_bytes", 0)), memory_mib, f"image {image_id}",
               img.meta.get("rootfs", "initramfs"))
    return img
