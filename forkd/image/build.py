"""Build the default guest image from Debian packages: Debian's cloud kernel + an initramfs holding
busybox, Python 3.11 (minimal + stdlib, with the shared libraries they link) and the forkd agent.

The image is content-addressed: its id is a hash of the package files and of the guest sources, so it is
rebuilt only when one of those changes. The rootfs is an uncompressed initramfs: it lives in guest RAM,
which children share copy-on-write, and an uncompressed archive skips a slow decompression under TCG.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from forkd.base.atomic import rename_into_place, write_bytes, write_json
from forkd.base.errors import ForkdError, NotFound
from forkd.base.hashing import sha256_file
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import make_private_dir
from forkd.base.procs import run
from forkd.guest import AGENT_MODULES
from forkd.image import debs

BUILDER_VERSION = "2"
PYTHON_PACKAGES = ["python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib"]
BUSYBOX_PACKAGE = "busybox-static"
# failover and net_failover: virtio_net.ko needs them (Debian builds all of these as modules)
GUEST_MODULES = ["virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
                 "virtio_console", "failover", "net_failover", "virtio_net", "virtio_blk"]
GUEST_DIR = Path(__file__).resolve().parent.parent / "guest"
GUEST_SOURCES = [*AGENT_MODULES, "init.sh", "boot.sh", "users.py"]  # boot.sh: stage-1 init of disk-backed images
USER_TOOLS = ("usr/sbin/adduser", "usr/sbin/userdel", "usr/sbin/deluser")  # users.py: this busybox has none
# parts of the stdlib a headless agent never uses; dropping them keeps guest RAM small
STDLIB_DROP = ["idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "test"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Image:
    id: str
    dir: Path
    kernel: Path
    initrd: Path
    kernel_sha256: str
    meta: dict

    @property
    def disk(self) -> Path | None:
        """The root disk (raw ext4) of a disk-backed image; None when the whole rootfs is the initramfs."""
        return self.dir / "rootfs.ext4" if self.meta.get("rootfs") == "disk" else None

    @classmethod
    def load(cls, d: Path) -> Image:
        try:
            meta = json.loads((d / "image.json").read_text())
        except (OSError, ValueError) as exc:
            raise NotFound(f"guest image in {d} is missing or unreadable ({exc})",
                           hint="run 'forkd image build'") from exc
        return cls(meta["id"], d, d / "vmlinuz", d / "initrd.img", meta["kernel_sha256"], meta)


def default_image(layout: Layout) -> Image:
    ptr = layout.images / "default"
    if not ptr.exists():
        raise NotFound("no guest image has been built", hint="run 'forkd image build'")
    return Image.load(layout.images / ptr.read_text().strip())


def _inputs(layout: Layout, progress: Progress) -> tuple[dict[str, Path], str]:
    progress("resolving Debian packages (apt-get download, cached)")
    pkgs = {"kernel": debs.kernel_package(layout.debs), "busybox": debs.download(layout.debs, BUSYBOX_PACKAGE)}
    for p in PYTHON_PACKAGES:
        pkgs[p] = debs.download(layout.debs, p)
    h = hashlib.sha256(f"forkd-image-builder {BUILDER_VERSION}\n".encode())
    for name in sorted(pkgs):
        h.update(f"{name}={pkgs[name].name}\n".encode())
    for src in GUEST_SOURCES:
        h.update(src.encode() + b"\0" + (GUEST_DIR / src).read_bytes())
    return pkgs, h.hexdigest()[:16]


def _ldd_closure(root: Path, binaries: list[Path]) -> set[Path]:
    """Host paths of the shared libraries the binaries need (the host is the same Debian release)."""
    libs: set[Path] = set()
    for b in binaries:
        out = run(["ldd", b], f"listing the libraries of {b.name}", ok=None).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts and parts[parts.index("=>") + 1].startswith("/"):
                libs.add(Path(parts[parts.index("=>") + 1]))
            elif parts and parts[0].startswith("/"):
                libs.add(Path(parts[0]))
            elif "not found" in line:
                raise ForkdError(f"{b.relative_to(root)} needs {parts[0]}, which this host lacks",
                                 hint="install the Debian package providing it (see README setup)")
    return libs


def _populate(root: Path, pkgs: dict[str, Path], kernel_out: Path, progress: Progress) -> None:
    stage = root.parent / "stage"
    progress("unpacking packages")
    for name, deb in pkgs.items():
        debs.extract(deb, stage / name)
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "usr/lib", "lib64", "etc", "proc", "sys", "dev", "tmp",
              "root", "run", "var/tmp", "forkd", "lib/modules/forkd"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    # busybox and its applets
    shutil.copy2(stage / "busybox" / "bin" / "busybox", root / "bin" / "busybox")
    applets = run([root / "bin" / "busybox", "--list-full"], "listing busybox applets").stdout.split()
    for a in applets:
        p = root / a
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            os.symlink("/bin/busybox", p)
    # python
    progress("assembling Python 3.11")
    for p in PYTHON_PACKAGES:
        src = stage / p / "usr"
        shutil.copytree(src, root / "usr", symlinks=True, dirs_exist_ok=True)
    for name in STDLIB_DROP:
        shutil.rmtree(root / "usr/lib/python3.11" / name, ignore_errors=True)
    shutil.rmtree(root / "usr/share", ignore_errors=True)
    for link in ["usr/bin/python3", "usr/bin/python"]:
        (root / link).unlink(missing_ok=True)
        os.symlink("python3.11", root / link)
    elf = [root / "usr/bin/python3.11", root / "bin/busybox"]
    elf += sorted((root / "usr/lib/python3.11/lib-dynload").glob("*.so"))
    for lib in _ldd_closure(root, elf[:1] + elf[2:]):
        dest = root / str(lib).lstrip("/")  # the path the dynamic loader searches, as on the host
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(lib.resolve(), dest)
    # kernel and modules
    progress("taking the kernel and virtio modules")
    take_kernel(stage / "kernel", pkgs["kernel"].name, kernel_out, root / "lib/modules/forkd")
    # forkd guest parts
    shutil.copy2(GUEST_DIR / "init.sh", root / "init")
    os.chmod(root / "init", 0o755)
    for name in AGENT_MODULES:
        shutil.copy2(GUEST_DIR / name, root / "forkd" / name)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (root / "home").mkdir(exist_ok=True)
    for tool in USER_TOOLS:
        shutil.copy2(GUEST_DIR / "users.py", root / tool)
        os.chmod(root / tool, 0o755)
    (root / "etc/hostname").write_text("forkd\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    progress("precompiling the standard library")
    _compile(root)
    shutil.rmtree(stage)


def take_kernel(kroot: Path, deb_name: str, kernel_out: Path, modules_dir: Path) -> None:
    """Copy the bzImage and the virtio modules (GUEST_MODULES) out of an extracted kernel package."""
    vmlinuz = sorted((kroot / "boot").glob("vmlinuz-*"))
    if not vmlinuz:
        raise ForkdError(f"{deb_name} holds no boot/vmlinuz-*")
    shutil.copy2(vmlinuz[-1], kernel_out)
    for m in GUEST_MODULES:
        hits = list((kroot / "lib/modules").rglob(f"{m}.ko"))
        if not hits:
            raise ForkdError(f"kernel module {m}.ko not in {deb_name}")
        shutil.copy2(hits[0], modules_dir / f"{m}.ko")


def _compile(root: Path) -> None:
    """Byte-compile with the guest's own interpreter so boots and warm-ups don't compile from source."""
    env = {"PYTHONHOME": str(root / "usr"), "PATH": "/usr/bin:/bin"}
    # exit 1: some files (e.g. lib2to3 test data) do not compile; harmless
    run([root / "usr/bin/python3.11", "-E", "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash",
         "-s", root, "-p", "/", root / "usr/lib/python3.11", root / "forkd"], "byte-compiling the guest stdlib",
        env=env, ok=(0, 1))


def write_initramfs(root: Path, out: Path) -> None:
    """Pack the directory `root` as an uncompressed newc cpio archive (what the kernel unpacks as initramfs)."""
    files = run(["find", ".", "-mindepth", "1"], "listing the initramfs", cwd=root).stdout.split("\n")
    listing = "\n".join(sorted(f for f in files if f)) + "\n"
    with open(out, "wb") as f:
        run(["cpio", "--quiet", "-o", "-H", "newc", "--reproducible"], "writing the initramfs (cpio)", cwd=root,
            input=listing, stdout=f, hint="apt-get install cpio")


def build(layout: Layout, progress: Progress = lambda s: None, force: bool = False) -> tuple[Image, bool]:
    """Build (or find in the cache) the default image. Returns (image, built_now)."""
    layout.ensure()
    pkgs, image_id = _inputs(layout, progress)
    final = layout.images / image_id
    if final.exists() and not force:
        write_bytes(layout.images / "default", (image_id + "\n").encode())
        return Image.load(final), False
    t0 = time.monotonic()
    layout.tmp.mkdir(parents=True, exist_ok=True)
    work = make_private_dir(layout.tmp / owned_name(f"image-{image_id}"))  # private (0700), a new name
    try:
        out = work / "out"
        out.mkdir(parents=True)
        _populate(work / "root", pkgs, out / "vmlinuz", progress)
        progress("writing the initramfs (cpio)")
        write_initramfs(work / "root", out / "initrd.img")
        shutil.rmtree(work / "root")
        meta = {
            "id": image_id,
            "builder_version": BUILDER_VERSION,
            "packages": {k: v.name for k, v in sorted(pkgs.items())},
            "kernel_sha256": sha256_file(out / "vmlinuz"),
            "initrd_sha256": sha256_file(out / "initrd.img"),
            "initrd_bytes": (out / "initrd.img").stat().st_size,
            "built_at": time.time(),
            "build_seconds": round(time.monotonic() - t0, 2),
        }
        write_json(out / "image.json", meta)
        for f in out.iterdir():
            os.chmod(f, 0o444)
        if final.exists():
            shutil.rmtree(final)
        rename_into_place(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_bytes(layout.images / "default", (image_id + "\n").encode())
    return Image.load(final), True


def stub_image(layout: Layout, driver: str) -> tuple[Image, bool]:
    """The default image under a driver that boots no guest kernel (VmmDriver.boots_kernel false: the fake driver):
    an empty kernel and initramfs, so nothing is downloaded or built. Returns (image, built_now)."""
    image_id = f"stub-{driver}"
    final = layout.images / image_id
    built = not final.exists()
    if built:
        layout.tmp.mkdir(parents=True, exist_ok=True)
        out = make_private_dir(layout.tmp / owned_name(f"image-{image_id}"))
        for name in ("vmlinuz", "initrd.img"):
            write_bytes(out / name, b"")
        write_json(out / "image.json", {"id": image_id, "builder_version": f"stub for the {driver} driver",
                                        "kernel_sha256": sha256_file(out / "vmlinuz"),
                                        "initrd_sha256": sha256_file(out / "initrd.img"), "initrd_bytes": 0,
                                        "built_at": time.time(), "build_seconds": 0.0})
        rename_into_place(out, final)
    write_bytes(layout.images / "default", (image_id + "\n").encode())
    return Image.load(final), built
