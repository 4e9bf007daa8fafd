"""The one place that knows the on-disk layout of forkd's state.

    $FORKD_HOME (default /var/lib/forkd)
      images/<image-id>/{vmlinuz, initrd.img, image.json}    content-addressed guest images
      images/<image-id>/rootfs.ext4                          disk-backed images: the root disk (raw, 0444)
      images/default                                         id of the default image (text)
      cache/debs/                                            downloaded Debian packages (the default image)
      cache/debian/<suite>/                                  mmdebstrap's package cache (forkd.image.debian)
      cache/accel.json                                       accelerator probe results by kernel hash
      cache/overlays/<key>.qcow2                             fresh child overlays, one per snapshot disk
    $FORKD_SHM (default /dev/shm)/forkd-<hash of FORKD_HOME>/   this home's private directory on tmpfs (0700)
      home                                                   which FORKD_HOME it belongs to (for gc)
      flat/<sha256>.mem                                      flat images children map, materialized once per boot
      forkd-<name>-<pid>@<start>-<random>.mem                scratch guest RAM of a parent / layer being built
      snapshots/<tag>/{memory.bin, vmstate, snapshot.json}   snapshots (store layer)
      snapshots/<tag>/disk.qcow2                             disk-backed: what the guest wrote (relative backing)
      children/<id>/{child.json, qmp.sock, agent.sock, console.log, qemu.log}   running children (sandbox layer)
      children/<id>/disk.qcow2                               disk-backed: the child's private overlay
      objects/<Kind>/<namespace>/<name>.json                 applied declarative objects + status (reconciler)
      objects/<Kind>/<namespace>/<name>.events.jsonl         their recent events
      logs/boot-<tag>-<time>/{qemu.log, console.log}        a failed boot's logs, kept (the newest 20)
      jobs/<job id>.json                                     the daemon's builds as jobs (forkd.service.jobs)
      format.json                                            {"version": N} of this layout (forkd.base.format)
      forkd.sock                                             the daemon's API socket (forkd serve)
      tmp/                                                   half-built things, named by their maker (base.owners)

Every directory above that forkd creates is private (0700, owned by forkd's user, never a symbolic link:
forkd.base.private); one that exists with another owner or a group/other-writable mode is refused, and guest
memory files in them are 0400 (the store sets snapshot file modes).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from forkd.base.atomic import write_bytes
from forkd.base.private import FILE_MODE, check_private_dir, ensure_private_dir
from forkd.base.settings import settings

MARKER = "home"  # in a home's tmpfs directory: the FORKD_HOME it belongs to


def tmpfs() -> Path | None:
    """The tmpfs directory memory files go to ($FORKD_SHM), None when it does not exist (then callers use a
    directory under $FORKD_HOME)."""
    shm = settings().shm
    return shm if shm.is_dir() else None


def stale_flat_dirs(shm: Path | None = None) -> list[Path]:
    """Flat-image directories on tmpfs whose FORKD_HOME no longer exists (a store deleted without `forkd snapshot rm`):
    their memory is RAM nobody can use any more. Only directories of forkd's own user that nobody else could write
    into are considered (another user's `forkd-*` is not ours to judge or delete)."""
    shm = shm or settings().shm
    out = []
    for d in sorted(shm.glob("forkd-*")) if shm.is_dir() else []:
        try:
            st = d.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                continue
            fd = os.open(d / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                home = os.read(fd, 4096).decode(errors="replace").strip()
            finally:
                os.close(fd)
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
    def shm_dir(self) -> Path | None:
        """This home's private directory on tmpfs (None without a tmpfs): flat images and scratch RAM."""
        shm = tmpfs()
        if shm is None:
            return None
        return shm / f"forkd-{hashlib.sha256(str(self.home).encode()).hexdigest()[:10]}"

    @property
    def flat_cache(self) -> Path:
        """Flat memory images children map MAP_PRIVATE. On tmpfs when there is one: a child's guest RAM is then
        shmem, which userfaultfd write-protect (a live branch by write-protect) supports and ext4 files are not."""
        shm_dir = self.shm_dir
        return self.cache / "flat" if shm_dir is None else shm_dir / "flat"

    def make_flat_cache(self) -> Path:
        """Create (or verify) the flat cache and every directory above it that forkd owns as private directories,
        marking which FORKD_HOME owns a tmpfs one (so gc can remove those whose home is gone). Raises UnsafePath
        for one somebody else made: called before every use, so an existing flat image is trusted only inside
        a directory verified just now."""
        flat = self.flat_cache
        shm_dir = self.shm_dir
        if shm_dir is None:
            ensure_private_dir(self.cache)
        else:
            ensure_private_dir(shm_dir)
            self._mark(shm_dir / MARKER)
        return ensure_private_dir(flat)

    def check_flat_cache(self) -> Path | None:
        """The flat cache if it exists and is private (UnsafePath if it is not; an older forkd's 0755 directories
        are tightened), None when it does not exist."""
        try:
            if self.shm_dir is not None:
                check_private_dir(self.shm_dir, tighten=True)
            return check_private_dir(self.flat_cache, tighten=True)
        except FileNotFoundError:
            return None

    def remark_tmpfs_dir(self) -> None:
        """Mark this home's tmpfs directory again if it exists (recovery: a process killed while marking it left
        no marker, and gc judges a directory by its marker once its home is gone)."""
        shm_dir = self.shm_dir
        if shm_dir is None:
            return
        try:
            check_private_dir(shm_dir, tighten=True)
        except FileNotFoundError:
            return
        self._mark(shm_dir / MARKER)

    def _mark(self, marker: Path) -> None:
        """Write `marker` whole unless it already names this home. A writer killed midway leaves an owned
        temporary (gc removes it), never the empty marker that made gc skip the directory once its home was gone
        (an empty or torn marker, so left by an older forkd, is rewritten here)."""
        want = (str(self.home) + "\n").encode()
        try:
            fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        else:
            try:
                if os.read(fd, len(want) + 1) == want:
                    return
            finally:
                os.close(fd)
        write_bytes(marker, want, mode=FILE_MODE, durable=False)

    def scratch_dir(self) -> Path:
        """A private directory for scratch guest RAM: this home's tmpfs directory, else $FORKD_HOME/tmp."""
        if self.shm_dir is None:
            return ensure_private_dir(self.tmp)
        return self.make_flat_cache().parent

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
    def logs(self) -> Path:
        """Logs kept after a failure (forkd.core.pipeline.logs): boot-<tag>-<time>/{qemu.log, console.log}."""
        return self.home / "logs"

    @property
    def jobs(self) -> Path:
        return self.home / "jobs"

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
        for d in (self.images, self.cache, self.debs, self.snapshots, self.children, self.objects, self.tmp):
            ensure_private_dir(d)  # 0700; an older forkd's 0755 ones are tightened; anyone else's refused
        return self
