"""Writing a snapshot: the one way a snapshot comes into being.

    with store.writing(record, timings) as w:   # begin: the directory and a `writing` manifest owned by us
        ... a VMM writes w.vmstate, a parent boots on w.disk ...
        w.seal(memory=..., vmstate=w.vmstate, disk=w.disk)   # files in place, fsynced, hashed
    # leaving the block: commit (files read-only, manifest `ready`) -- or, if anything raised inside it, the
    # snapshot is marked `failed` (its data files dropped) and the original exception propagates unchanged

`seal` takes each file either in place (the writer's own path, written by a VMM or a tool) or from elsewhere:
  memory   a Path: copied in sparse and hashed (a scratch memory file is then kept as the cached flat image of
           its content), or copied without re-hashing when `memory_sha256` is given (compaction of a verified
           flat image); or a Diff: only the pages of `image` that differ from `base` are stored (a chain layer;
           with `candidates`, only those pages are compared: a diff branch's captured pages);
  vmstate  a Path: copied in unless in place; fsynced and hashed;
  disk     a Path: moved in unless in place (a VMM's scratch overlay); fsynced and hashed.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd.base.atomic import publish, sync_file
from forkd.base.errors import ForkdError
from forkd.base.hashing import sha256_file
from forkd.store import chain
from forkd.store.memfile import copy_sparse_hashed
from forkd.store.snapshot import DISK, MEMORY, VMSTATE, Snapshot

if TYPE_CHECKING:
    from forkd.store.store import SnapshotStore


@dataclass(frozen=True)
class Diff:
    """A chain layer's memory: the pages of `image` (its full memory image, a scratch file kept afterwards as the
    cached flat image) that differ from `base` (its parent's flat image)."""

    base: Path
    image: Path
    candidates: Path | None = None  # a layer-format dir of the only pages that may differ (compared alone)


class SnapshotWriter:
    """A snapshot being written; see the module docstring. `snap` is the record (`writing`, then `ready` or
    `failed`); `memory`, `vmstate` and `disk` are where its files go."""

    def __init__(self, store: SnapshotStore, snap: Snapshot, timings: dict[str, float] | None):
        self.store = store
        self.snap = snap
        self.dir = store.dir(snap.tag)
        self.memory, self.vmstate, self.disk = self.dir / MEMORY, self.dir / VMSTATE, self.dir / DISK
        self.timings = timings  # copied into the manifest at commit (so it includes the steps after seal)
        self.sealed = False

    def take(self, src: Path, dest: Path) -> Path:
        """Move a scratch file (e.g. a VMM's overlay) to `dest`, one of this snapshot's paths: renamed, or copied
        across filesystems."""
        try:
            os.rename(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copyfile(src, dest)
            os.unlink(src)
        return dest

    def seal(self, *, memory: Path | Diff, vmstate: Path, disk: Path | None = None,
             memory_sha256: str | None = None, **fields: Any) -> Snapshot:
        """Bring the files in, fsync and hash them, and fill the record (plus `fields`). Commit happens when the
        `writing` block ends without an exception."""
        mem = self._seal_diff(memory) if isinstance(memory, Diff) else self._seal_memory(memory, memory_sha256)
        if vmstate != self.vmstate:
            shutil.copyfile(vmstate, self.vmstate)
        st = sync_file(self.vmstate)
        record = {**mem, "vmstate_sha256": sha256_file(self.vmstate), "vmstate_bytes": st.st_size}
        if disk is not None:
            if disk != self.disk:
                self.take(disk, self.disk)
            record.update(disk_sha256=sha256_file(self.disk), disk_bytes=sync_file(self.disk).st_blocks * 512)
        self.snap = self.snap.with_(**record, **fields)
        self.sealed = True
        return self.snap

    def _seal_memory(self, src: Path, known_sha256: str | None) -> dict:
        if src == self.memory:  # written in place (a VMM mapped it)
            st = sync_file(src)
            return {"memory_sha256": known_sha256 or sha256_file(src), "memory_bytes": st.st_size,
                    "memory_stored_bytes": st.st_blocks * 512}
        if known_sha256 is not None:  # content known and verified: copy extents, no re-hash
            with publish(self.memory, mode=0o600) as fd:
                size = chain.copy_extents(src, fd)
                os.fsync(fd)
                stored = os.fstat(fd).st_blocks * 512
            return {"memory_sha256": known_sha256, "memory_bytes": size, "memory_stored_bytes": stored}
        content, size, stored = copy_sparse_hashed(src, self.memory)
        self._record_content(content)
        try:  # the scratch image is its children's flat image: keep it instead of copying it back later
            self.store.adopt_flat(src, content)
        except OSError:
            pass  # materialize() copies it from the store on first use
        return {"memory_sha256": content, "memory_bytes": size, "memory_stored_bytes": stored}

    def _record_content(self, content: str) -> None:
        """Write the content hash into the `writing` manifest before its flat image is kept, so a failure from
        here on (this process's, or recovery's after it died) removes that image with the snapshot."""
        self.snap = self.snap.with_(memory_sha256=content)
        self.store.record_writing(self.snap)

    def _seal_diff(self, diff: Diff) -> dict:
        if diff.candidates is not None:
            pages, stored = chain.write_known_diff(diff.base, diff.candidates, self.dir)
        else:
            pages, stored = chain.write_diff(diff.base, diff.image, self.dir)
        content, size = chain.hash_image(diff.image), diff.image.stat().st_size
        self._record_content(content)
        self.store.adopt_flat(diff.image, content)  # moved away when on the cache's filesystem
        return {"memory_sha256": content, "memory_bytes": size, "diff_pages": pages,
                "diff_sha256": chain.diff_hash(self.dir), "memory_stored_bytes": stored}


@contextmanager
def writing(store: SnapshotStore, snap: Snapshot, timings: dict[str, float] | None = None
            ) -> Iterator[SnapshotWriter]:
    """Begin `snap`, yield its writer; commit when the block ends sealed, fail it when anything raised (the
    exception propagates unchanged) or when the block ended without sealing."""
    begun = store.begin(snap)
    w = SnapshotWriter(store, begun, timings)
    try:
        yield w
        if not w.sealed:
            raise ForkdError(f"snapshot {snap.tag!r}: its writer ended without sealing it")
        if timings is not None:
            w.snap = w.snap.with_(timings_ms=dict(timings))
        w.snap = store.commit(w.snap)
    except BaseException as exc:
        try:
            w.snap = store.fail(begun, exc)
        except Exception as cleanup:  # noqa: BLE001 - never mask the failure that matters
            exc.add_note(f"marking snapshot {snap.tag!r} failed did not work either: {cleanup}")
        raise
