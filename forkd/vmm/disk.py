"""Copy-on-write disks for disk-backed guest images: qcow2 files made and changed with `qemu-img`.

The chain of a disk-backed child, bottom to top:

    images/<id>/rootfs.ext4         raw ext4 built from the image's rootfs (read-only, 0444)
    snapshots/<tag>/disk.qcow2      what the parent wrote while booting and warming up (frozen at the snapshot)
    [snapshots/<layer>/disk.qcow2]  what each chain layer wrote on top (frozen)
    children/<id>/disk.qcow2        this child's private overlay: the only file its VMM writes

So no two children ever share a writable disk, and nothing a child writes reaches a snapshot or the image.

Backing references inside files that live in the store are *relative* (a store or a pack can move as a whole);
a child's overlay, which never moves, names its backing file by absolute path. A fresh overlay is always the
same bytes for the same backing file, so it is made once with `qemu-img create` (10-20 ms) into a template and
then copied for each child (well under a millisecond).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from forkd.base.atomic import temp_name
from forkd.base.errors import ForkdError
from forkd.base.settings import settings
from forkd.vmm.driver import Disks
from forkd.vmm.qcow2_header import check_overlay

QCOW2 = "qcow2"
RAW = "raw"


class DiskError(ForkdError):
    pass


def qemu_img() -> str:
    found = shutil.which(settings().qemu_img)
    if not found:
        raise DiskError("qemu-img not found (disk-backed images need it)", hint="apt-get install qemu-utils")
    return found


def _run(argv: list[str], what: str) -> str:
    res = subprocess.run([qemu_img(), *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise DiskError(f"{what}: qemu-img {argv[0]} failed: {res.stderr.strip()[-500:]}")
    return res.stdout


def backing_ref(overlay: Path, backing: Path, relative: bool) -> str:
    """How `overlay` names `backing` in its header: relative to the overlay's directory, or absolute."""
    if relative:
        return os.path.relpath(os.path.abspath(backing), os.path.dirname(os.path.abspath(overlay)))
    return os.path.abspath(backing)


def fmt_of(path: Path) -> str:
    """qcow2 for forkd's overlays, raw for an image's ext4."""
    return QCOW2 if str(path).endswith(".qcow2") else RAW


def create_overlay(dest: Path, backing: Path, relative: bool = True) -> None:
    """A new, empty qcow2 at `dest` whose reads fall through to `backing`."""
    if not Path(backing).is_file():
        raise DiskError(f"backing disk {backing} is missing")
    _run(["create", "-q", "-f", QCOW2, "-F", fmt_of(backing), "-b", backing_ref(dest, backing, relative),
          str(dest)], f"creating the overlay {dest}")


def check_written(path: Path, backing: Path) -> None:
    """Refuse an overlay a VMM wrote unless its header is one forkd made on `backing` (forkd.vmm.qcow2_header):
    called before anything running as root opens it by its header."""
    check_overlay(path, backing, fmt_of(backing))


def set_backing(path: Path, backing: Path, relative: bool = True) -> None:
    """Rewrite only the header's backing reference (`rebase -u`): for a VMM's overlay moved next to the same
    content (its header is checked first: it must name `backing` already)."""
    check_written(path, backing)
    _run(["rebase", "-u", "-q", "-f", QCOW2, "-F", fmt_of(backing), "-b", backing_ref(path, backing, relative),
          str(path)], f"re-pointing {path} at {backing}")


def rebase(path: Path, backing: Path) -> None:
    """Make `path` depend on `backing` only (`rebase` in safe mode: every cluster that differs between its old
    backing chain and `backing` is copied into it). Used to cut a branch's disk loose from its source's chain."""
    _run(["rebase", "-q", "-f", QCOW2, "-F", fmt_of(backing), "-b", backing_ref(path, backing, True), str(path)],
         f"rebasing {path} onto {backing}")


def flatten(src: Path, dest: Path, base: Path) -> None:
    """Write `src` (read through its whole chain) as a new qcow2 `dest` backed by `base`, holding only the clusters
    that differ from `base` (compaction of a layer chain)."""
    _run(["convert", "-q", "-O", QCOW2, "-B", backing_ref(dest, base, True), "-F", fmt_of(base), str(src),
          str(dest)], f"flattening {src}")


def chain(path: Path) -> list[dict]:
    """`qemu-img info --backing-chain` of `path`: one dict per file, top first. Opened read-only, shared."""
    out = _run(["info", "-U", "--output=json", "--backing-chain", str(path)], f"reading {path}")
    return json.loads(out)


def backing_of(path: Path) -> Path | None:
    """The file `path`'s header names as its backing file, resolved (None for a file without one)."""
    info = chain(path)[0]
    ref = info.get("full-backing-filename") or info.get("backing-filename")
    if not ref:
        return None
    return Path(os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), ref)))


def _template_key(base: Path) -> str:
    st = os.stat(base)
    return hashlib.sha256(f"{os.path.abspath(base)}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:24]


def new_overlay(base: Path, dest: Path, template_dir: Path | None = None) -> None:
    """A child's private overlay on `base` at `dest` (absolute backing path). With `template_dir`, the overlay is
    made once per base (keyed by its path, size and mtime) and copied afterwards."""
    if template_dir is None:
        create_overlay(dest, base, relative=False)
        return
    key = _template_key(base)
    template = template_dir / f"{key}.qcow2"
    if not template.exists():
        template_dir.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(template)  # qemu-img writes it; renamed into place whole
        try:
            create_overlay(tmp, base, relative=False)
            os.replace(tmp, template)
        finally:
            tmp.unlink(missing_ok=True)
    shutil.copyfile(template, dest)


def prune_templates(template_dir: Path, dry_run: bool = False) -> list[Path]:
    """Remove overlay templates whose base is gone or has changed (its snapshot was deleted or re-made)."""
    stale = []
    for t in sorted(template_dir.glob("*.qcow2")) if template_dir.is_dir() else []:
        try:
            base = backing_of(t)
            ok = base is not None and base.is_file() and _template_key(base) == t.stem
        except (DiskError, OSError, ValueError):
            ok = False
        if not ok:
            stale.append(t)
            if not dry_run:
                t.unlink(missing_ok=True)
    return stale


class Qcow2Disks(Disks):
    """The `Disks` of a driver whose root disks are qcow2 files (qemu-img): QEMU's, and the fake's."""

    def check_written(self, path: Path, backing: Path) -> None:
        check_written(path, backing)

    def create_overlay(self, dest: Path, backing: Path, relative: bool = True) -> None:
        create_overlay(dest, backing, relative)

    def set_backing(self, path: Path, backing: Path, relative: bool = True) -> None:
        set_backing(path, backing, relative)

    def rebase(self, path: Path, backing: Path) -> None:
        rebase(path, backing)

    def flatten(self, src: Path, dest: Path, base: Path) -> None:
        flatten(src, dest, base)

    def prune_templates(self, template_dir: Path, dry_run: bool = False) -> list[Path]:
        return prune_templates(template_dir, dry_run)

