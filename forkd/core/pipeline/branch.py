"""Branch: snapshot a running child into an ordinary, forkable snapshot, with the source paused as briefly as
possible. The VMM side (capture, resume, conversion) is the driver's: see forkd/vmm/CONTRACT.md.

Modes:
  * `live`: taken by pages when it can (forkd.core.pipeline.branch_paged: the pages the source wrote since its
    restore and its device state, in a pause that grows with those pages; then sealed as a self-contained
    snapshot), else, here, by a live capture (QEMU: `background-snapshot`, userfaultfd write-protect). The source
    stops only while the VMM saves its device state and arms write-protect over all of guest RAM (the VMM's
    reported `downtime`: it grows with the RAM), then runs while RAM streams out.
    With `wait=False` (`--no-wait`) and no disk, the call returns as soon as the source stopped for the capture
    (QEMU's STOP event): the instant the snapshot holds is fixed from then on, and the source resumes by itself a
    few ms later (awaited in the background, with the stream). A caller's next request to the source simply waits
    for that resume.
  * `full`: stop-the-world: pause, the whole RAM and device state to the stream, resume.
  * `diff`: forkd.core.pipeline.branch_diff (`ByPages`, this module's job with that capture): the source stops only
    while its device state (without RAM) and the pages it wrote since its restore are taken, and the result is a
    chain layer over the source's snapshot. Its pause grows with the pages written, not with guest RAM.

Disk-backed children: the branch's disk is a copy of the child's overlay, taken while nothing can write it, so
disk and memory are from one instant. In `full`/`diff` mode the VM is paused (the VMM flushes its block layer
when it stops). In `live` mode the agent freezes the guest's root filesystem instead (FIFREEZE: written back and
flushed, then every writer waits while the vCPUs run), the overlay is copied, the live capture runs with its
usual few-ms pause, and the filesystem is thawed once the source runs again; children of the branch thaw in
`forked`, and a freeze the host never lifts lifts itself after FREEZE_MAX_SECONDS. When the agent is held by
another connection (or cannot freeze), live mode falls back to pausing the VM for the copy, which then also
covers the VMM's capture set-up (55-270 ms measured here). Either way the copy is rebased onto the image's ext4
afterwards (every cluster its old chain had is pulled in), so the branch's disk depends on the image only.

The result of `live` and `full` is a self-contained snapshot (its own full memory file + device state) written
through SnapshotStore.writing: `writing` until converted, fsynced and hashed, then `ready` (or `failed`). It
records where it came from in labels (`forkd.dev/branch-of`, `forkd.dev/branch-source-snapshot`), not in
`parent_tag`, because it does not depend on its source's files. (A `diff` branch does: its `parent_tag` is the
source's snapshot.)

Memory: a branch charges nothing to its source's memory group: the guest RAM it reads is the source's
flat image, populated and charged to forkd's `shared` group when it was materialized, and the stream is written
by a process forkd starts, not by the VMM (forkd.vmm.stream_pump). A diff branch reads the source's pages from
forkd's process and writes them to forkd's files; a source with memory in swap (idle page-out) has it read back
before the pause (ChildHandle.page_in, as a request to it would), charged to its own group as before
its page-out. A memory-limited source is never pushed over its limit by being branched.

Safety:
  * the source is resumed on every path (VmmDriver.ensure_running whenever it was running before): a failure that
    passes the branch's hold on it resumes it (forkd.sandbox.child.CaptureHold); a resume that fails while another
    failure is on its way out is noted on that failure, never raised in its place;
  * what a failure becomes is decided in one place, from the failure, its step and the source's fate
    (forkd.core.pipeline.branch_errors.branch_failure, called by `BranchJob.failures` only): when the source dies
    during the branch (OOM-killed, crashed, killed), the branch raises `SourceLost` (Conflict, HTTP 409) naming the
    child's fate (`oom-killed`, `dead`, `removed`), with the original failure as its cause and in its message; the
    snapshot is `failed` with the same message;
  * one branch per source at a time: a per-child lock (non-blocking), a second one gets Conflict naming it;
  * at most FORKD_MAX_BRANCHES branches per FORKD_HOME, background conversions included (lock-file slots, so the
    count holds across processes and a killed process frees its slot);
  * `wait=False` returns as soon as the source runs again; conversion continues in a daemon thread of *this*
    process, which must live until it ends (the daemon is such a process; a CLI `--no-wait` waits for it before
    exiting, see forkd/cli/branch.py). A process killed mid-branch leaves the snapshot `writing`: the next
    `SnapshotStore.recover()` (daemon start-up) marks it failed, and Runtime.recover resumes the source.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from forkd.base.errors import Conflict, ForkdError
from forkd.base.settings import settings
from forkd.base.steps import Step
from forkd.core.pipeline.branch_disk import copy_disk, freeze_fs, thaw_fs
from forkd.core.pipeline.branch_errors import PREPARE, RESUME, BranchError, Case, branch_failure
from forkd.core.pipeline.branch_plan import Strategy
from forkd.core.pipeline.branch_source import Source, SourceLost
from forkd.core.pipeline.job import Job
from forkd.core.requests import Branch
from forkd.store.snapshot import DISK, Snapshot
from forkd.vmm.driver import Capture

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime


__all__ = ["BranchError", "BranchJob", "BranchResult", "Conversions", "SourceLost", "Streamed", "Way"]


@dataclass
class BranchResult:
    snapshot: Snapshot
    mode: str
    source: str
    returned_ms: float  # from the call to its return
    pause_ms: float | None  # live: the VMM's downtime (None until the stream completed); stop modes: stop..resume
    qemu_downtime_ms: float | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    thread: threading.Thread | None = None  # the background conversion (wait=False)
    capture: str = ""  # how the source was captured: pages | write-protect | stop (BranchJob.capture_kind)
    capture_note: str | None = None  # a live branch that could not be taken by pages: why

    def to_json(self) -> dict:
        return {"snapshot": self.snapshot.to_json(), "mode": self.mode, "source": self.source,
                "returned_ms": self.returned_ms, "pause_ms": self.pause_ms, "capture": self.capture,
                "capture_note": self.capture_note, "qemu_downtime_ms": self.qemu_downtime_ms,
                "timings_ms": self.timings_ms}


class Conversions:
    """A runtime's background conversions (`wait=False` branches): daemon threads of this process, which must live
    until they end (the daemon does; a CLI `--no-wait` waits for them: `wait`)."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def add(self, t: threading.Thread) -> None:
        with self._lock:
            self._threads[:] = [x for x in self._threads if x.is_alive()] + [t]

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every conversion started so far to end (each for at most `timeout`)."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)


class Way(Protocol):
    """A capture's own part of a branch (chosen by its Strategy; every other step is the job's): checks and
    resources before the snapshot is begun, the snapshot's record, the capture steps while the source is involved,
    and the steps once it is free."""

    def prepare(self, job: BranchJob) -> None: ...
    def record(self, job: BranchJob, snap: Snapshot) -> Snapshot: ...
    def steps(self, job: BranchJob) -> list[Step]: ...
    def finish_steps(self, job: BranchJob) -> list[Step]: ...


class Streamed:
    """Captures `write-protect` (the VMM's live capture) and `stop` (paused for the whole copy): the VMM streams
    device state and all of RAM to a file, converted to a snapshot once the source is free."""

    def prepare(self, job: BranchJob) -> None:
        problem = job.rt.driver.live_capture_problem(job.source_vm) if job.req.mode == "live" else None
        if problem is not None:
            nope = job.plan.not_paged
            why = f" (and not by pages: {nope})" if nope else ""
            raise Conflict(f"child {job.req.child_id} cannot be branched live: {problem[0]}{why}", hint=problem[1])

    def record(self, job: BranchJob, snap: Snapshot) -> Snapshot:
        return snap

    def steps(self, job: BranchJob) -> list[Step]:
        return [("capture", job.capture_live if job.plan.capture == "write-protect" else job.capture_stopped)]

    def finish_steps(self, job: BranchJob) -> list[Step]:
        disk = [("disk_rebase", job.rebase_disk)] if job.machine.disk is not None else []
        resumed = [("resume_wait", job.await_resume)] if job.returns_at_stop else []
        return [*resumed, ("stream", job.wait_stream), ("convert", job.convert), *disk, ("hash", job.seal)]


class BranchJob(Job):
    """One branch: the source looked up once (`Source`), its capture chosen before it starts (`Strategy`, from
    forkd.core.pipeline.branch_plan.plan_branch) and carried out by `way`."""

    what = "branch"

    def __init__(self, rt: Runtime, req: Branch, plan: Strategy, src: Source, way: Way | None = None):
        super().__init__(rt)
        self.req, self.plan, self.src = req, plan, src
        self.way: Way = way if way is not None else Streamed()
        self.rec, self.source, self.machine, self.child_files = src.rec, src.snapshot, src.machine, src.files
        self.handle = rt.handles.of(src.rec)
        self.step = PREPARE  # the step running now: what a failure is mapped by (branch_failure)
        self.t_call = time.perf_counter()
        self.capture: Capture | None = None
        self.result = BranchResult(snapshot=None, mode=req.mode, source=req.child_id, returned_ms=0.0,  # type: ignore
                                   pause_ms=None, timings_ms=self.timings, capture=self.capture_kind,
                                   capture_note=plan.note)

    @property
    def capture_kind(self) -> str:
        """What the result says: pages (the source's written pages, forkd.vmm.diff_capture: live by pages and
        diff), write-protect (the VMM's live capture of all of RAM) or stop (paused while RAM streams out)."""
        return "pages" if self.plan.capture == "diff" else self.plan.capture

    # -- before anything is written: refusals leave no snapshot behind --------------------------------
    def prepare(self) -> None:
        """Hold the source for the capture (forkd.sandbox.child.ChildHandle.hold_for_capture: its branch lock, a
        branch slot, its VMM attached), then the capture's own checks and resources."""
        self.hold = self.handle.hold_for_capture(self.stack, settings().max_branches)
        self.source_vm = self.hold.vm
        self.way.prepare(self)

    def record(self) -> Snapshot:
        return self.way.record(self, self.base_record())

    def base_record(self) -> Snapshot:
        """The `writing` snapshot every capture starts from: the source's description, where it came from."""
        req, s = self.req, self.source
        labels = {**req.labels, "forkd.dev/branch-of": req.child_id,
                  "forkd.dev/branch-source-snapshot": s.tag, "forkd.dev/branch-mode": req.mode}
        return Snapshot(tag=req.tag, status="writing", created_at=time.time(), memory_mib=s.memory_mib,
                        vcpus=s.vcpus, accel=s.accel, image_id=s.image_id, kernel_sha256=s.kernel_sha256,
                        qemu_version=s.qemu_version, warm_imports=s.warm_imports, warm_run=s.warm_run,
                        warm_exec=s.warm_exec, labels=labels)

    # -- the request ---------------------------------------------------------------------------------
    def steps(self) -> list[Step]:
        """The steps while the source is involved; `finish_steps` run after it is free (maybe in the background)."""
        return [("stage", self.stage), ("connect", self.connect), *self.way.steps(self)]

    def finish_steps(self) -> list[Step]:
        return self.way.finish_steps(self)

    def start(self) -> BranchResult:
        with self.stack:
            with self.failures():
                self.prepare()
                self.timings["prepare"] = (time.perf_counter() - self.t_call) * 1000.0
                self.begin()
                self.timings["begin"] = (time.perf_counter() - self.t_call) * 1000.0 - self.timings["prepare"]
                self.run(self.steps())
                if self.req.wait:
                    self.finish()
            if not self.req.wait:
                self.hand_off()
        self.result.snapshot = self.writer.snap
        self.result.returned_ms = (time.perf_counter() - self.t_call) * 1000.0
        return self.result

    def finish(self) -> None:
        self.run(self.finish_steps())
        t = self.timings
        steps = {name for name, _ in self.steps() + self.finish_steps()}
        t["total"] = sum(v for k, v in t.items() if k in steps)
        t.update({k: round(v, 3) for k, v in t.items()})
        if self.result.qemu_downtime_ms is not None:
            t["qemu_downtime"] = self.result.qemu_downtime_ms

    def hand_off(self) -> None:
        """Move every resource to a daemon thread that finishes the branch; return at once."""
        self.stack = self.stack.pop_all()

        def background() -> None:
            try:
                with self.stack, self.failures():
                    self.finish()
            finally:
                self.result.snapshot = self.writer.snap

        t = threading.Thread(target=_guarded(background), name=f"forkd-branch-{self.req.tag}", daemon=True)
        self.result.thread = t
        self.rt.conversions.add(t)
        t.start()

    # -- when it fails -------------------------------------------------------------------------------
    def run(self, steps: list[Step]) -> None:
        super().run([(name, self._at(name, fn)) for name, fn in steps])

    def _at(self, name: str, fn):
        def step() -> object:
            self.step = name
            return fn()
        return step

    @contextmanager
    def failures(self) -> Iterator[None]:
        """The one place a branch's failure is mapped to what its caller sees (branch_errors.branch_failure, from
        the failure, its step and the source's fate), the failure kept as the cause. Inside the writer's block,
        so the failed snapshot's manifest says it too; the hold, below it on the stack, resumes the source."""
        try:
            yield
        except Exception as exc:
            case = Case(self.req.child_id, self.req.tag, self.plan.capture,
                        str(self.req.tmp_dir or self.rt.layout.tmp))
            error = branch_failure(exc, self.step, self.handle.fate(exc), case).exception()
            if error is None:
                raise
            raise error from exc

    # -- steps while the source is involved ----------------------------------------------------------
    def stage(self) -> None:
        # short name: the conversion's QEMU sockets live below it, and AF_UNIX paths end at 108 bytes
        self.work = self.workdir("b", under=self.req.tmp_dir)
        if self.capture_kind == "write-protect":
            # QEMU 7.2 (measured here): a background snapshot whose stream write fails mid-way (ENOSPC) leaves the
            # source reporting 'running' but no longer answering. So refuse up front unless the whole RAM fits.
            st = os.statvfs(self.work)
            need = self.source.memory_mib * (1 << 20) + (64 << 20)
            if st.f_bavail * st.f_frsize < need:
                raise BranchError(f"not enough space in {self.work.parent} for the branch stream: "
                                  f"{st.f_bavail * st.f_frsize >> 20} MiB free, {need >> 20} MiB needed",
                                  hint="free space there, or point $FORKD_HOME/tmp elsewhere")

    def connect(self) -> None:
        self.t0 = time.perf_counter()
        self.hold.connect(timeout=30)

    @property
    def was_running(self) -> bool:
        return self.hold.was_running

    def open_capture(self) -> Capture:
        self.capture = self.rt.driver.open_capture(self.source_vm, self.work / "stream", live=self.req.mode == "live")
        self.stack.callback(self._drop_capture)
        return self.capture

    @property
    def returns_at_stop(self) -> bool:
        """A live `wait=False` branch of a child without a disk returns once the source stopped (the instant is
        fixed); the source's resume is awaited in the background. With a disk, the thaw needs the resume first."""
        return self.capture_kind == "write-protect" and not self.req.wait and self.machine.disk is None

    def capture_live(self) -> None:
        cap = self.open_capture()
        frozen = None
        try:
            if self.machine.disk is not None:  # the disk as of the device state: copied while nothing can write it
                frozen = freeze_fs(self.child_files.agent, self.timings) if self.was_running else None
                if frozen is None:
                    cap.pause()
                copy_disk(self.child_files.disk, self.work / DISK, self.machine.disk, self.timings,
                          self.rt.driver.disks)
            cap.start()
            if self.returns_at_stop:
                cap.wait_stopped(timeout=60)
            else:
                cap.wait_resumed(timeout=60)
        except BaseException as exc:
            self.hold.resume_after(exc)  # now, not on the way out: the thaw below needs the source running
            raise
        else:
            if self.returns_at_stop:
                self.timings["stopped"] = (time.perf_counter() - self.t0) * 1000.0
                self.timings.update(cap.timings)
            else:
                self.live_resumed()
        finally:
            if frozen is not None:
                thaw_fs(frozen, self.timings)

    def await_resume(self) -> None:
        """After an early return (`returns_at_stop`): wait for the source to run again, in the background (a
        failure resumes it: the hold's)."""
        self.capture.wait_resumed(timeout=60)
        self.live_resumed()

    def live_resumed(self) -> None:
        cap = self.capture
        # QEMU's RESUME event after our STOP already says the source runs: the usual check (a QMP round trip
        # before the call returns) is skipped then
        if self.was_running and cap.stop_resume_ms is None:
            self._resume()
        self.timings["resumed"] = (cap.resumed_at - self.t0) * 1000.0
        self.timings.update(cap.timings)
        self.result.pause_ms = cap.stop_resume_ms
        self.timings["pause"] = self.result.pause_ms if self.result.pause_ms is not None else -1.0

    def capture_stopped(self) -> None:
        cap = self.open_capture()
        t_stop = time.perf_counter()
        cap.pause()  # from here a failure resumes the source on its way out (the hold's)
        if self.machine.disk is not None:
            copy_disk(self.child_files.disk, self.work / DISK, self.machine.disk, self.timings, self.rt.driver.disks)
        cap.start()
        cap.wait_done(timeout=self.req.timeout)
        if self.was_running:
            self._resume()
        self.result.pause_ms = (time.perf_counter() - t_stop) * 1000.0
        self.result.qemu_downtime_ms = cap.downtime_ms
        self.timings["pause"] = self.result.pause_ms

    def _resume(self) -> None:
        """The source resumed after its capture (step `resume` while it runs: a failure says so)."""
        was, self.step = self.step, RESUME
        self.hold.resume()
        self.step = was

    def _drop_capture(self) -> None:
        """On failure: stop a capture still in flight and put the source's settings back (best effort)."""
        cap, self.capture = self.capture, None
        if cap is not None:
            with suppress(ForkdError, OSError):
                cap.cancel()
            with suppress(ForkdError, OSError):
                cap.close()

    # -- steps once the source is free again ---------------------------------------------------------
    def wait_stream(self) -> None:
        """Wait for a live stream to complete, then free the source: another branch of it may start."""
        cap = self.capture
        if cap.live:
            cap.wait_done(timeout=self.req.timeout)
            self.result.qemu_downtime_ms = cap.downtime_ms
            # pause_ms becomes the VMM's own figure; timings["pause"] keeps the STOP->RESUME event stamps
            if cap.downtime_ms is not None:
                self.result.pause_ms = cap.downtime_ms
        cap.close()
        self.capture = None
        self.hold.free()

    def convert(self) -> None:
        w = self.writer
        self.timings.update(self.rt.driver.stream_to_snapshot(self.machine, self.work / "stream", w.memory,
                                                              w.vmstate, self.work / "helper",
                                                              timeout=self.req.timeout))
        (self.work / "stream").unlink(missing_ok=True)

    def rebase_disk(self) -> None:
        """The source's overlay as it was, cut loose from its snapshot's chain."""
        w = self.writer
        self.rt.driver.disks.rebase(w.take(self.work / DISK, w.disk), self.rt.image(self.source.image_id).disk)

    def seal(self) -> None:
        w = self.writer
        w.seal(memory=w.memory, vmstate=w.vmstate, disk=w.disk if self.machine.disk is not None else None)


def _guarded(fn):
    def run() -> None:
        with suppress(BaseException):  # the failure is recorded in the snapshot's manifest (status failed)
            fn()
    return run
