"""The snapshot store: where snapshots live, and the writing -> ready | failed life cycle.

A snapshot directory is created with a manifest saying `writing` (and the writer's pid and start time)
before any data file; it becomes `ready` only after every file is written, fsynced and hashed, and its files
are then made read-only. `recover()` marks `writing` snapshots whose writer is gone as `failed` and drops their
data files, so a crash never leaves a half-written snapshot that looks usable.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from forkd.base.atomic import fsync_dir, write_json
from forkd.base.errors import Conflict, NotFound
from forkd.base.names import check_tag
from forkd.base.paths import Layout
from forkd.base.procs import is_alive, start_time
from forkd.store.snapshot import MANIFEST, MEMORY, VMSTATE, CorruptManifest, Snapshot


class SnapshotStore:
    def __init__(self, layout: Layout):
        self.layout = layout.ensure()
        self.root = layout.snapshots

    # -- paths -------------------------------------------------------------------------------------
    def dir(self, tag: str) -> Path:
        return self.root / check_tag(tag)

    def memory_path(self, tag: str) -> Path:
        return self.dir(tag) / MEMORY

    def vmstate_path(self, tag: str) -> Path:
        return self.dir(tag) / VMSTATE

    # -- reading -----------------------------------------------------------------------------------
    def get(self, tag: str) -> Snapshot:
        path = self.dir(tag) / MANIFEST
        try:
            return Snapshot.from_file(path)
        except FileNotFoundError:
            raise NotFound(f"no snapshot tagged {tag!r}",
                           hint="list them with 'forkd snapshots'; create one with 'forkd snapshot create'") from None

    def get_ready(self, tag: str) -> Snapshot:
        """The snapshot, if it can be restored from: ready, with its data files present."""
        snap = self.get(tag)
        if snap.status != "ready":
            why = f": {snap.error}" if snap.error else ""
            raise Conflict(f"snapshot {tag!r} is {snap.status}, not ready{why}",
                           hint="wait for it to finish, or delete it with 'forkd rmi' and create it again")
        for p in (self.memory_path(tag), self.vmstate_path(tag)):
            if not p.exists():
                raise CorruptManifest(f"snapshot {tag!r} is marked ready but {p} is missing",
                                      hint=f"delete it with 'forkd rmi --force {tag}' and create it again")
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
    def begin(self, snap: Snapshot) -> Snapshot:
        """Create the directory and a `writing` manifest owned by this process."""
        d = self.dir(snap.tag)
        if d.exists():
            try:
                old = self.get(snap.tag)
            except CorruptManifest:
                old = None
            if old is not None and old.status != "failed":
                raise Conflict(f"snapshot {snap.tag!r} already exists ({old.status})",
                               hint=f"delete it first with 'forkd rmi {snap.tag}' or pick another tag")
            self._remove_dir(d)
        d.mkdir(parents=True)
        snap = snap.with_(status="writing", writer_pid=os.getpid(), writer_started=start_time(os.getpid()))
        write_json(d / MANIFEST, snap.to_json())
        fsync_dir(self.root)
        return snap

    def commit(self, snap: Snapshot) -> Snapshot:
        d = self.dir(snap.tag)
        for f in (MEMORY, VMSTATE):
            os.chmod(d / f, 0o444)
        snap = snap.with_(status="ready", writer_pid=None, writer_started=None, error=None)
        write_json(d / MANIFEST, snap.to_json(), mode=0o444)
        return snap

    def fail(self, snap: Snapshot, error: str) -> Snapshot:
        d = self.dir(snap.tag)
        for f in (MEMORY, VMSTATE):
            (d / f).unlink(missing_ok=True)
        snap = snap.with_(status="failed", error=error, writer_pid=None, writer_started=None)
        write_json(d / MANIFEST, snap.to_json())
        return snap

    def remove(self, tag: str) -> None:
        d = self.dir(tag)
        if not d.exists():
            raise NotFound(f"no snapshot tagged {tag!r}", hint="list them with 'forkd snapshots'")
        self._remove_dir(d)

    def _remove_dir(self, d: Path) -> None:
        # rename first so a crash mid-delete never leaves a partial snapshot under its tag
        trash = self.layout.tmp / f"rm-{d.name}-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(d, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def recover(self) -> list[str]:
        """Mark `writing` snapshots whose writer died as failed. Returns their tags."""
        failed = []
        for snap in self.list():
            if isinstance(snap, Snapshot) and snap.status == "writing" and not (
                    snap.writer_pid and is_alive(snap.writer_pid, snap.writer_started)):
                self.fail(snap, "the process writing this snapshot died before it finished")
                failed.append(snap.tag)
        return failed
