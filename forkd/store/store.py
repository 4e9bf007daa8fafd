"""The snapshot store: where snapshots live, and the writing -> ready | failed life cycle.

A snapshot directory comes into place with a manifest saying `writing` (and the writer's pid and start time)
before any data file (made under a temporary name and renamed with its manifest); it becomes `ready` only after
every file is written, fsynced and hashed, and its files are then made read-only. Snapshot directories are private
(0700) and sealed files 0400: guest RAM and device state are readable by forkd's user only. Flat images live in the
private flat cache (Layout.make_flat_cache), verified before every use. `recover()` marks `writing` snapshots whose
writer is gone as `failed` and drops their data files, so a crash never leaves a half-written snapshot that looks
usable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from forkd.base.atomic import publish, rename_into_place, write_json
from forkd.base.errors import Conflict, NotFound, first_line
from forkd.base.names import check_tag
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import UnsafePath, check_private_file, make_private_dir, set_mode
from forkd.base.procs import is_alive, start_time
from forkd.base.space import require_room
from forkd.store import chain
from forkd.store.chain import ChainError
from forkd.store.snapshot import DISK, MANIFEST, MEMORY, VMSTATE, CorruptManifest, Snapshot, is_sha256
from forkd.store.writer import SnapshotWriter, writing

log = logging.getLogger("forkd.store")
DATA_FILES = (MEMORY, VMSTATE, chain.PAGES_FILE, chain.DATA_FILE, DISK)
SEALED_MODE = 0o400  # a ready snapshot's files and flat images: read-only, forkd's user only
OPEN_MODE = 0o600  # files being written


def populate_here(fd: int) -> object:
    """Allocate every page of a flat image in this process (the default `SnapshotStore.populate`)."""
    st = os.fstat(fd)
    if st.st_blocks * 512 < st.st_size:
        os.posix_fallocate(fd, 0, st.st_size)
    return None


class SnapshotStore:
    def __init__(self, layout: Layout, populate: Callable[[int], object] = populate_here):
        self.layout = layout.ensure()
        self.root = layout.snapshots
        # Flat images are populated in full before any child maps them, so no child's fault ever allocates (and is
        # charged for) a page of the shared image; the runtime charges them to forkd's `shared` cgroup
        # (forkd.sandbox.cgroups.populate_shared, where the accounting model is described).
        self.populate = populate

    # -- paths -------------------------------------------------------------------------------------
    def dir(self, tag: str) -> Path:
        return self.root / check_tag(tag)

    def memory_path(self, tag: str) -> Path:
        return self.dir(tag) / MEMORY

    def vmstate_path(self, tag: str) -> Path:
        return self.dir(tag) / VMSTATE

    def disk_path(self, tag: str) -> Path:
        """A disk-backed snapshot's overlay (its backing chain ends in the image's rootfs.ext4)."""
        return self.dir(tag) / DISK

    # -- reading -----------------------------------------------------------------------------------
    def get(self, tag: str) -> Snapshot:
        path = self.dir(tag) / MANIFEST
        try:
            return Snapshot.from_file(path)
        except FileNotFoundError:
            raise NotFound(f"no snapshot tagged {tag!r}",
                           hint="list them with 'forkd snapshot ls'; create one with 'forkd snapshot create'") from None

    def get_ready(self, tag: str) -> Snapshot:
        """The snapshot, if it can be restored from: ready, with its data files present."""
        snap = self.get(tag)
        if snap.status != "ready":
            why = f": {snap.error}" if snap.error else ""
            raise Conflict(f"snapshot {tag!r} is {snap.status}, not ready{why}",
                           hint="wait for it to finish, or delete it with 'forkd snapshot rm' and create it again")
        needed = (chain.PAGES_FILE, chain.DATA_FILE, VMSTATE) if snap.is_layer else (MEMORY, VMSTATE)
        needed += (DISK,) if snap.has_disk else ()
        for p in (self.dir(tag) / f for f in needed):
            if not p.exists():
                raise CorruptManifest(f"snapshot {tag!r} is marked ready but {p} is missing",
                                      hint=f"delete it with 'forkd snapshot rm --force {tag}' and create it again")
        return snap

    def list(self) -> list[Snapshot | CorruptManifest]:
        out: list[Snapshot | CorruptManifest] = []
        for d in sorted(self.root.iterdir()) if self.root.exists() else []:
            if d.is_dir() and not d.name.startswith("."):
                try:
                    out.append(Snapshot.from_file(d / MANIFEST))
                except FileNotFoundError:
                    continue
                except CorruptManifest as exc:
                    out.append(exc)
        return out

    # -- life cycle --------------------------------------------------------------------------------
    def writing(self, snap: Snapshot, timings: dict[str, float] | None = None
                ) -> AbstractContextManager[SnapshotWriter]:
        """The one way to make a snapshot: `with store.writing(record) as w: ... w.seal(...)` (forkd.store.writer).
        begin/commit/fail below are its steps (and what tests use to fake a half-written snapshot)."""
        return writing(self, snap, timings)

    def begin(self, snap: Snapshot) -> Snapshot:
        """Create the directory and a `writing` manifest owned by this process: made under a temporary name and
        renamed into place with its manifest, so no directory is ever seen under a tag without its record (a full
        filesystem could fail the manifest after the directory; such a directory, left by an older forkd, is
        replaced as a failed snapshot is)."""
        d = self.dir(snap.tag)
        if d.exists():
            old = self._record_or_none(snap.tag)
            if old is not None and old.status != "failed":
                raise Conflict(f"snapshot {snap.tag!r} already exists ({old.status})",
                               hint=f"delete it first with 'forkd snapshot rm {snap.tag}' or pick another tag")
            self._remove_dir(d)
        snap = snap.with_(status="writing", writer_pid=os.getpid(), writer_started=start_time(os.getpid()))
        staged = make_private_dir(self.layout.tmp / owned_name(f"new-{snap.tag}"))  # 0700 from the start
        try:
            write_json(staged / MANIFEST, snap.to_json(), mode=OPEN_MODE)
            rename_into_place(staged, d)
        except OSError as exc:
            shutil.rmtree(staged, ignore_errors=True)
            if d.exists():
                raise Conflict(f"snapshot {snap.tag!r} appeared while it was being begun",
                               hint=f"delete it first with 'forkd snapshot rm {snap.tag}' or pick another tag") from exc
            raise
        return snap

    def _record_or_none(self, tag: str) -> Snapshot | None:
        """The record of `tag`, None when its directory has none or an unreadable one."""
        try:
            return self.get(tag)
        except (CorruptManifest, NotFound):
            return None

    def commit(self, snap: Snapshot) -> Snapshot:
        d = self.dir(snap.tag)
        self.seal_modes(d)
        snap = snap.with_(status="ready", writer_pid=None, writer_started=None, error=None)
        write_json(d / MANIFEST, snap.to_json(), mode=SEALED_MODE)
        return snap

    @staticmethod
    def seal_modes(d: Path) -> None:
        """The modes of a finished snapshot directory: the directory 0700, its data files 0400 (links are not
        followed). Packs installing a snapshot directory call it too."""
        set_mode(d, 0o700)
        for f in DATA_FILES:
            if (d / f).is_file() and not (d / f).is_symlink():
                set_mode(d / f, SEALED_MODE)

    def fail(self, snap: Snapshot, error: str | BaseException) -> Snapshot:
        """Mark `snap` failed (an exception is recorded by its first line) and drop its data files."""
        if isinstance(error, BaseException):
            error = first_line(error)
        d = self.dir(snap.tag)
        content = snap.memory_sha256 or self._recorded_content(snap.tag)
        for f in DATA_FILES:
            (d / f).unlink(missing_ok=True)
        snap = snap.with_(status="failed", error=error, writer_pid=None, writer_started=None)
        write_json(d / MANIFEST, snap.to_json(), mode=OPEN_MODE)
        self._drop_flat_unless_owned(content)  # a failed snapshot has no children: its kept image goes too
        return snap

    def record_writing(self, snap: Snapshot) -> None:
        """Persist a `writing` record's fields so far. The writer records its memory's content hash before it
        keeps the scratch image as the cached flat image, so whoever fails the snapshot later (the writer, or
        recover() after the writer died) knows which flat image it left."""
        if snap.status != "writing":
            raise ValueError(f"record_writing takes a writing record, not a {snap.status} one")
        write_json(self.dir(snap.tag) / MANIFEST, snap.to_json(), mode=OPEN_MODE)

    def _recorded_content(self, tag: str) -> str | None:
        try:
            return self.get(tag).memory_sha256
        except (CorruptManifest, FileNotFoundError, NotFound):
            return None

    def _drop_flat_unless_owned(self, content: str | None) -> None:
        """Unlink the cached flat image of `content` when no snapshot that is not failed records it (the cache
        is a cache: materialize() makes an image again when one is needed)."""
        if not content or not is_sha256(content):
            return
        if content in {s.memory_sha256 for s in self.list() if isinstance(s, Snapshot) and s.status != "failed"}:
            return
        try:
            if self.layout.check_flat_cache() is not None:  # never unlink through a foreign directory
                self.flat_cache_path(content).unlink(missing_ok=True)
        except UnsafePath as exc:  # left in place, and said so: it holds RAM on tmpfs until someone acts
            log.warning("flat image %s was not removed: %s (hint: %s)", content[:16], exc.message, exc.hint)

    def remove(self, tag: str) -> None:
        d = self.dir(tag)
        if not d.exists():
            raise NotFound(f"no snapshot tagged {tag!r}", hint="list them with 'forkd snapshot ls'")
        gone = self._record_or_none(tag)  # a directory without its record goes too
        self._remove_dir(d)
        if gone is not None:
            self._drop_flat_unless_owned(gone.memory_sha256)

    def install(self, staged: Path, snap: Snapshot) -> Snapshot:
        """Bring a verified snapshot made elsewhere (an unpacked pack) into the store under `snap.tag`: `staged` (a
        directory on the store's filesystem holding exactly the data files of `snap`) gets the record, as
        `writing` by this process, is fsynced and renamed into place, then committed (modes, `ready`). A crash
        in between leaves a `writing` snapshot that recover() fails. Conflict if the tag exists."""
        d = self.dir(snap.tag)
        want = {VMSTATE, chain.PAGES_FILE, chain.DATA_FILE} if snap.is_layer else {VMSTATE, MEMORY}
        want |= {DISK} if snap.has_disk else set()
        have = {p.name for p in staged.iterdir()} - {MANIFEST}
        odd = [p.name for p in staged.iterdir() if p.is_symlink() or not p.is_file()]
        if have != want or odd or snap.status != "ready":
            raise CorruptManifest(f"cannot install {snap.tag!r} from {staged}: it holds {sorted(have)}, "
                                  f"a snapshot of its kind holds {sorted(want)} (regular files only; {snap.status})")
        if snap.is_layer:  # built on what is in this store now: the same parent, with the same content
            parent = self.get_ready(snap.parent_tag)
            if parent.memory_sha256 != snap.parent_content_hash:
                raise ChainError(f"cannot install {snap.tag!r}: its parent {parent.tag!r} here holds other content",
                                 hint="unpack the chain it was built on, or delete the other parent first")
        if d.exists():
            raise Conflict(f"snapshot {snap.tag!r} already exists",
                           hint=f"delete it first with 'forkd snapshot rm {snap.tag}' or unpack into another "
                                "FORKD_HOME")
        staging = snap.with_(status="writing", writer_pid=os.getpid(), writer_started=start_time(os.getpid()))
        write_json(staged / MANIFEST, staging.to_json())
        os.chmod(staged, 0o700)  # private from the start; commit() seals the files
        try:
            rename_into_place(staged, d)
        except OSError as exc:
            if d.exists():
                raise Conflict(f"snapshot {snap.tag!r} appeared while it was being installed",
                               hint="run the unpack again") from exc
            raise
        return self.commit(staging)

    # -- chains ------------------------------------------------------------------------------------
    def flat_cache_path(self, content_hash: str) -> Path:
        """The cached flat image of a content hash; only a hex sha256 names one (never a path from a record)."""
        if not is_sha256(content_hash):
            raise CorruptManifest(f"content hash {content_hash!r} is not a sha256 hex digest: it names no file",
                                  hint="delete the snapshot that records it with 'forkd snapshot rm --force'")
        return self.layout.flat_cache / f"{content_hash}.mem"

    def adopt_flat(self, image: Path, content_hash: str) -> Path:
        """Keep an image just built (a parent's memory file, a layer's scratch copy) as the cached flat image of
        its content: moved when it is on the cache's filesystem, else copied extent by extent. `image` is gone
        or left for the caller to delete afterwards."""
        self.layout.make_flat_cache()  # verified private (UnsafePath otherwise) before anything goes in
        target = self.flat_cache_path(content_hash)
        if self._sealed_flat(target):
            return self._populated(target)
        if image.stat().st_dev == self.layout.flat_cache.stat().st_dev:
            self._populated(image)  # the scratch file becomes the cached image: populated before it is shared
            set_mode(image, SEALED_MODE)
            os.rename(image, target)
        else:  # another filesystem
            require_room(target.parent, image.stat().st_size, f"the flat image {content_hash[:12]}")
            with publish(target, mode=SEALED_MODE) as fd:
                os.ftruncate(fd, image.stat().st_size)
                self.populate(fd)
                chain.copy_extents(image, fd)
        return target

    @staticmethod
    def _sealed_flat(target: Path) -> bool:
        """True if `target` is a flat image forkd made: its own regular file, one link, no permission for group or
        others (0400 sealed, 0600 while `_populated` fills holes). Any other file at that name goes, so the caller
        builds the image again: QEMU creates a missing mem-path as an empty 0644 file; the VMM that made it fails
        its restore over those zeros (seen when the flat cache was deleted under a fork), and without this every
        later fork would too. Removed only if it is still the file judged (same inode)."""
        if check_private_file(target, forbid=0o077):
            return True
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(target)
            if not stat.S_ISDIR(st.st_mode) and not check_private_file(target, forbid=0o077):
                os.unlink(target)  # judged again just before: a file forkd published meanwhile stays
        return False

    def _populated(self, image: Path) -> Path:
        """`image` with every page allocated (see `populate`); an image already whole is not opened for writing."""
        if (st := os.lstat(image)).st_blocks * 512 >= st.st_size:
            return image
        mode = st.st_mode & 0o7777
        if not mode & 0o200:  # a sealed image: writable by its owner only while the holes are filled
            set_mode(image, mode | 0o200)
        try:
            fd = os.open(image, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self.populate(fd)
            finally:
                os.close(fd)
        finally:
            if not mode & 0o200:
                set_mode(image, mode)
        return image

    def flat_path(self, snap: Snapshot) -> Path:
        """The flat memory image children of `snap` map: a copy of a base's memory file, or a layer's composed
        image, in the flat cache (on tmpfs: see Layout.flat_cache)."""
        if snap.memory_sha256 is None:  # not ready: a name no flat image has (materialize needs a ready head)
            return self.layout.flat_cache / "unknown.mem"
        return self.flat_cache_path(snap.memory_sha256)

    def ancestors(self, tag: str) -> list[Snapshot]:
        """The chain from its base to `tag` (inclusive), checked link by link from the manifests alone:
        every ancestor present and ready, and holding the content each layer was built on."""
        out = [self.get_ready(tag)]
        while out[-1].is_layer:
            child = out[-1]
            try:
                parent = self.get(child.parent_tag)
            except NotFound:
                raise ChainError(f"snapshot {tag!r}: its ancestor {child.parent_tag!r} is missing",
                                 hint="unpack or rebuild the ancestor, or delete this chain") from None
            if parent.status != "ready":
                raise ChainError(f"snapshot {tag!r}: its ancestor {parent.tag!r} is {parent.status}")
            if parent.memory_sha256 != child.parent_content_hash:
                raise ChainError(f"snapshot {tag!r}: its ancestor {parent.tag!r} was altered (content "
                                 f"{(parent.memory_sha256 or '?')[:12]}, layer built on "
                                 f"{(child.parent_content_hash or '?')[:12]})",
                                 hint="rebuild the layer on the current ancestor")
            out.append(parent)
            if len(out) > 256:
                raise ChainError(f"snapshot {tag!r}: chain deeper than 256 (a cycle?)")
        return list(reversed(out))

    def depth(self, tag: str) -> int:
        return len(self.ancestors(tag)) - 1

    def dependents(self, tag: str) -> list[str]:
        """Snapshots built on `tag`, directly or through others (nearest first)."""
        snaps = [s for s in self.list() if isinstance(s, Snapshot)]
        out, frontier = [], [tag]
        while frontier:
            nxt = [s.tag for s in snaps if s.parent_tag in frontier and s.tag not in out]
            out += nxt
            frontier = nxt
        return out

    def materialize(self, tag: str) -> Path:
        """The flat image of `tag`, built into the content-addressed cache on first use and verified then. An
        existing image is used only if the cache directory is private to forkd now and the image is forkd's own
        regular file (UnsafePath for a directory somebody else made: never a path a VMM would map)."""
        chain_ = self.ancestors(tag)
        head = chain_[-1]
        self.layout.make_flat_cache()
        target = self.flat_path(head)
        if self._sealed_flat(target):
            return self._populated(target)
        root = self.dir(chain_[0].tag) / MEMORY
        require_room(target.parent, root.stat().st_size, f"the flat image of snapshot {tag!r}")
        with publish(target, mode=SEALED_MODE) as fd:
            os.ftruncate(fd, root.stat().st_size)
            self.populate(fd)  # every page allocated (and charged) before any is written: see `populate`
            chain.copy_extents(root, fd)
            for layer in chain_[1:]:
                if chain.diff_hash(self.dir(layer.tag)) != layer.diff_sha256:
                    raise ChainError(f"snapshot {tag!r}: layer {layer.tag!r} was altered (its diff files no longer "
                                     "match their recorded hash)",
                                     hint=f"delete it with 'forkd snapshot rm --force --cascade {layer.tag}' and "
                                          "rebuild")
                chain.apply_diff(self.dir(layer.tag), fd)
            # a base's copy is trusted (hashed when it was written or unpacked); a composed image is checked
            got = chain.hash_fd(fd) if head.is_layer else head.memory_sha256
            if got != head.memory_sha256:
                raise ChainError(f"snapshot {tag!r}: its layers do not add up to the recorded content "
                                 f"({got[:12]} != {(head.memory_sha256 or '?')[:12]}): a layer was altered",
                                 hint=f"delete it with 'forkd snapshot rm --force {tag}' and rebuild")
        return target

    def _remove_dir(self, d: Path) -> None:
        # rename first so a crash mid-delete never leaves a partial snapshot under its tag
        trash = self.layout.tmp / owned_name(f"rm-{d.name}")  # owned: gc finishes a dead remover's job
        os.rename(d, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def recover(self) -> list[str]:
        """Mark `writing` snapshots whose writer died as failed, and this home's tmpfs directory as its own again.
        Returns the failed tags."""
        try:
            self.layout.remark_tmpfs_dir()
        except UnsafePath as exc:  # refused again, this way, when a flat image is next made there
            log.warning("%s", exc)
        failed = []
        for snap in self.list():
            if isinstance(snap, Snapshot) and snap.status == "writing" and not (
                    snap.writer_pid and is_alive(snap.writer_pid, snap.writer_started)):
                self.fail(snap, "the process writing this snapshot died before it finished")
                failed.append(snap.tag)
        return failed
