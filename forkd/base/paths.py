"""The one place that knows the on-disk layout of forkd's state.

    $FORKD_HOME (default /var/lib/forkd)
      images/<image-id>/{vmlinuz, initrd.img, image.json}    content-addressed guest images
      images/<image-id>/rootfs.ext4                          disk-backed images: the root disk (raw, 0444)
      images/default                                         id of the default image (text)
      cache/debs/                                            downloaded Debian packages
      cache/accel.json                                       accelerator probe results by kernel hash
      cache/overlays/<key>.qcow2                             fresh child overlays, one per snapshot disk
    $FORKD_SHM (default /dev/shm)/forkd-<hash of FORKD_HOME>/flat/<sha256>.mem
                                                             flat images children map, materialized once per boot
      snapshots/<tag>/{memory.bin, vmstate, snapshot.json}   snapshots (store layer)
      snapshots/<tag>/disk.qcow2                             disk-backed: what the guest wrote (relative backing)
      children/<id>/{child.json, qmp.sock, agent.sock, console.log, qemu.log}   running children (sandbox layer)
      children/<id>/disk.qcow2                               disk-backed: the child's private overlay
      objects/<Kind>/<name>.json                             applied declarative objects + status (reconciler)
      objects/<Kind>/<name>.events.jsonl                     their recent events
      format.json                                            {"version": N} of this layout (forkd.base.format)
      forkd.sock                                             the daemon's API socket (forkd serve)
      tmp/                                                   half-built things; removed on start-up
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from forkd.base.settings import settings


def tmpfs() -> Path | None:
    """The tmpfs directory memory files go to ($FORKD_SHM), None when it does not exist (then callers use a
    directory under $FORKD_HOME)."""
    shm = settings().shm
    return shm if shm.is_dir() else None


def stale_flat_dirs(shm: Path | None = None) -> list[Path]:
    """Flat-image directories on tmpfs whose FORKD_HOME no longer exists (a store deleted without `forkd rmi`):
    their memory is RAM nobody can use any more."""
    shm = shm or settings().shm
    out = []
    for d in sorted(shm.glob("forkd-*")) if shm.is_dir() else []:
        try:
            home = (d / "home").read_text().strip()
        except OSError:
            continue  # not ours to judge
        if home and not Path(home).is_dir():
            out.append(d)
    return out


@dataclass(frozen=True)
class Layout:
    home: Path

    @classmethod
    def from_env(cls) -> Layout:
        return cls(settings().home.absolute())

    @property
    def images(self) -> Path:
        return self.home / "images"

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def debs(self) -> Path:
        return self.cache / "debs"

    @property
    def flat_cache(self) -> Path:
        """Flat memory images children map MAP_PRIVATE. On tmpfs when there is one: a child's guest RAM is then
        shmem, which userfaultfd write-protect (live branch) supports and ext4 files are not."""
        shm = tmpfs()
        if shm is None:
            return self.cache / "flat"
        return shm / f"forkd-{hashlib.sha256(str(self.home).encode()).hexdigest()[:10]}" / "flat"

    def make_flat_cache(self) -> Path:
        """Create the flat cache, marking which FORKD_HOME owns it (so gc can remove those whose home is gone)."""
        d = self.flat_cache
        d.mkdir(parents=True, exist_ok=True)
        marker = d.parent / "home"
        if not marker.exists():
            marker.write_text(str(self.home) + "\n")
        return d

    @property
    def accel_cache(self) -> Path:
        return self.cache / "accel.json"

    @property
    def snapshots(self) -> Path:
        return self.home / "snapshots"

    @property
    def children(self) -> Path:
        return self.home / "children"

    @property
    def objects(self) -> Path:
        return self.home / "objects"

    @property
    def daemon_socket(self) -> Path:
        return self.home / "forkd.sock"

    @property
    def daemon_pid(self) -> Path:
        return self.home / "forkd.pid"

    @property
    def tmp(self) -> Path:
        return self.home / "tmp"

    def snapshot_dir(self, tag: str) -> Path:
        return self.snapshots / tag

    def child_dir(self, child_id: str) -> Path:
        return self.children / child_id

    def ensure(self) -> Layout:
        from forkd.base.format import open_home

        open_home(self.home)  # stamps a new home, migrates an older one, refuses one a newer forkd wrote
        for d in (self.images, self.debs, self.snapshots, self.children, self.objects, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.children, 0o700)
        return self
