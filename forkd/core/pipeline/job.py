"""The Job every request handler is: named steps with timings, resources on one ExitStack.

A job built with a cancel token (forkd.base.cancel; the daemon's build jobs pass one, forkd.service.jobs) is
cancelled cooperatively: the token is checked before `prepare`, before every step and once more just before the
snapshot is committed, and setting it stops the VMM the job holds (through the driver, from the cancelling
thread), which ends a step waiting on its guest. A cancelled job unwinds as any failure does (VMM stopped, scratch
removed, the snapshot marked failed), then removes the failed snapshot it began, and raises Cancelled. It cannot
interrupt a step that does not wait on the VMM (a boot still waiting for its guest, copying and hashing the memory
file): that step finishes first. Past the last check the snapshot is committed: a cancel then is too late.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.cancel import Cancelled, CancelToken
from forkd.base.errors import NotFound
from forkd.base.owners import owned_name
from forkd.base.private import create_private_file, ensure_private_dir, make_private_dir
from forkd.base.space import require_room
from forkd.base.steps import Step, run_steps
from forkd.store.snapshot import CorruptManifest, Snapshot
from forkd.store.writer import SnapshotWriter
from forkd.vmm.driver import Vm

if TYPE_CHECKING:
    from forkd.core.runtime import Progress, Runtime

log = logging.getLogger("forkd.pipeline")


def quiet(_: str) -> None:
    pass


class Job:
    """One request being carried out. Subclasses give `prepare` (checks and look-ups that must fail before
    anything is written), `record` (the `writing` snapshot) and `steps`; `execute` runs them."""

    what = "job"

    def __init__(self, rt: Runtime, progress: Progress = quiet, cancel: CancelToken | None = None):
        self.rt = rt
        self.progress = progress
        self.cancel = cancel or CancelToken()  # set by another thread: see the module docstring
        self._vm_lock = threading.Lock()
        self.stack = ExitStack()
        self.timings: dict[str, float] = {}
        self.writer: SnapshotWriter | None = None
        self.vm: Vm | None = None  # a VMM this job started and has not saved yet: stopped on unwind

    # -- the request ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        pass

    def record(self) -> Snapshot:
        raise NotImplementedError

    def steps(self) -> list[Step]:
        raise NotImplementedError

    def execute(self) -> Snapshot:
        """Prepare, begin the snapshot, run the steps; commit (or fail) and release everything on the way out.
        Cancelled (the snapshot it began removed) when its token was set before the commit."""
        try:
            with self.stack:
                self.stack.enter_context(self.cancel.on_cancel(self._stop_vm))
                self.cancel.check()
                self.prepare()
                self.begin()
                self.run(self.steps())
                self.cancel.check()  # the last moment: leaving the block commits the snapshot
        except Exception as exc:
            if not self.cancel.cancelled:
                raise
            self._remove_cancelled()
            if isinstance(exc, Cancelled):
                raise
            raise Cancelled(f"{self.what} cancelled: {self.cancel.reason}", hint="submit it again") from exc
        return self.writer.snap

    def _remove_cancelled(self) -> None:
        """The failed snapshot this job began, removed (only while its record is still the one this job wrote)."""
        if self.writer is None:
            return
        mine = self.writer.snap
        try:
            now = self.rt.store.get(mine.tag)
            if now.status == "failed" and now.created_at == mine.created_at:
                self.rt.store.remove(mine.tag)
        except (NotFound, CorruptManifest):
            pass
        except OSError as exc:  # left failed (forkd snapshot rm removes it): the cancel is what the caller sees
            log.warning("cancelled snapshot %r was not removed: %s", mine.tag, exc)

    # -- helpers for the steps -----------------------------------------------------------------------
    def begin(self) -> SnapshotWriter:
        self.writer = self.stack.enter_context(self.rt.store.writing(self.record(), self.timings))
        return self.writer

    def hold_vm(self, vm: Vm) -> Vm:
        """Keep `vm` until a step saves it (and sets `self.vm = None`); stopped on unwind otherwise."""
        self.vm = vm
        self.stack.callback(self._stop_vm)
        return vm

    def run(self, steps: list[Step]) -> None:
        run_steps(steps, self.timings, self.what, wrap=False, check=self.cancel.check)

    def _stop_vm(self) -> None:
        """Stop the VMM held (on unwind, or from the cancelling thread: whichever comes first stops it)."""
        with self._vm_lock:
            vm, self.vm = self.vm, None
        if vm is not None:
            self.rt.driver.stop(vm)

    def workdir(self, name: str, under: Path | None = None) -> Path:
        """A new private directory (0700, owned: forkd.base.owners), removed on unwind."""
        if under is not None:  # a directory the caller chose (e.g. a branch's tmp_dir): the work dir is private
            base = Path(under)
            base.mkdir(parents=True, exist_ok=True)
        else:
            base = ensure_private_dir(self.rt.layout.tmp)
        d = make_private_dir(base / owned_name(name, nbytes=4))  # unique, owned (gc); the parent is private
        self.stack.callback(shutil.rmtree, d, ignore_errors=True)
        return d

    def scratch_memory(self, name: str, size_mib: int) -> Path:
        """A new, empty scratch guest-memory file (0600, created O_EXCL|O_NOFOLLOW) in this home's private
        directory on tmpfs ($FORKD_SHM/forkd-<home hash>/, else $FORKD_HOME/tmp), named as gc expects
        (`forkd-<name>-<pid>@<start>-<random>.mem`), removed on unwind (unless the store adopted it). A VMM opening it
        by path finds forkd's file, in a directory nobody else can enter."""
        where = self.rt.layout.scratch_dir()
        require_room(where, size_mib << 20, f"the guest memory of {name} ({size_mib} MiB)")
        path = where / owned_name(f"forkd-{name}", ".mem", nbytes=16)
        os.close(create_private_file(path))
        self.stack.callback(path.unlink, missing_ok=True)
        return path
