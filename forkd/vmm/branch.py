"""QEMU side of BRANCH: snapshot a *running* child into a forkable snapshot (see shared DESIGN.md, "Live branch").

Two steps, both measured on QEMU 7.2 / TCG here:

1. `stream_out`: on the running child's own QMP socket, migrate the whole VM (device state + all of RAM) into a
   stream file handed over as a descriptor (`getfd` + `fd:NAME`: children run under `-sandbox ...,spawn=deny`, so
   `exec:` URIs are forbidden). Children were restored with `x-ignore-shared` on; it is switched off first (a
   child's RAM is a `share=off` mapping, so it is never "shared" anyway, but the flag must not leak into the
   stream format). In **live** mode the capability `background-snapshot` is on: QEMU stops the VM for a few ms,
   saves the device state, arms userfaultfd write-protect on guest RAM *while stopped* and resumes it, then copies
   RAM out page by page, copying a page first whenever the running guest writes it. Memory and device state are
   therefore from the same instant, by QEMU's own construction (we never arm write-protect ourselves before a
   pause: that is upstream's defect 5). In **stop** mode (`diff`/`full`) the caller has paused the VM with
   `stop`, and the same migration runs against a stopped VM.
2. `convert`: a helper QEMU (same machine, `-S -incoming defer`, RAM a `share=on` memory-backend-file on the new
   snapshot's `memory.bin`) loads the stream, then saves device state only (`x-ignore-shared`) to `vmstate` via
   `QemuDriver.save`, and quits. The result has the same shape as a snapshot made by `snapshot create`.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.vmm.disk import new_overlay
from forkd.vmm.driver import Machine, RunFiles, Vm, run_steps
from forkd.vmm.qemu import QemuDriver, kernel_stub, qemu_argv
from forkd.vmm.qmp import QMPClient

STREAM_FD_NAME = "branch"


LIVE_HINT = ("QEMU's background snapshot write-protects guest RAM with userfaultfd, which Linux supports for "
             "anonymous, shmem (tmpfs) and hugetlbfs memory only; this child maps its snapshot's memory.bin from a "
             "regular filesystem. Keep FORKD_HOME (its snapshots) on tmpfs, e.g. /dev/shm, or use --mode full")


class BranchError(ForkdError):
    pass


def fs_type(path: Path) -> str:
    """Filesystem type of the mount holding `path` (longest mount-point prefix in /proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mnt = left.split()[4].replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, right.split()[0]
    return kind


def vmm_memory_path(pid: int) -> Path | None:
    """The `mem-path=` of a running QEMU's RAM backend, from its command line."""
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    for arg in argv:
        for part in arg.decode(errors="replace").split(","):
            if part.startswith("mem-path="):
                return Path(part[len("mem-path="):])
    return None


def live_capable(memory: Path) -> bool:
    """Whether a child mapping `memory` can be live-branched (see LIVE_HINT)."""
    return fs_type(memory) in ("tmpfs", "hugetlbfs", "ramfs")


def set_caps(qmp: QMPClient, **caps: bool) -> None:
    qmp.execute("migrate-set-capabilities",
                {"capabilities": [{"capability": k.replace("_", "-"), "state": v} for k, v in caps.items()]})


def run_state(qmp: QMPClient) -> str:
    return (qmp.execute("query-status") or {}).get("status", "unknown")


def _event_time(ev: dict) -> float:
    ts = ev.get("timestamp") or {}
    return ts.get("seconds", 0) + ts.get("microseconds", 0) / 1e6


class Stream:
    """One migration of a running (live) or paused (stop) child into a stream file."""

    def __init__(self, qmp: QMPClient, path: Path, live: bool):
        self.qmp = qmp
        self.path = Path(path)
        self.live = live
        self.fd: int | None = None
        self.info: dict = {}
        self.t_start = 0.0
        self.resumed_at: float | None = None  # perf_counter when we saw the source run again (live mode)
        self.stop_resume_ms: float | None = None  # STOP -> RESUME event timestamps (QEMU's clock), live mode
        self.timings: dict[str, float] = {}
        self.paused_event: dict | None = None  # our own STOP, when the VM was paused before the stream (pause())

    def pause(self) -> None:
        """Stop the VM before the stream starts (a disk-backed source's disk is copied while it is paused); the
        live stream then resumes it as soon as its device state is saved."""
        self.qmp.events.clear()
        self.qmp.execute("stop")
        now = time.time()
        self.paused_event = next((e for e in self.qmp.events if e.get("event") == "STOP"), None) or {
            "event": "STOP", "timestamp": {"seconds": int(now), "microseconds": int(now % 1 * 1e6)}}

    def open(self) -> None:
        """Create the stream file (do this before pausing anything: an unwritable destination fails here)."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

    def start(self) -> None:
        """Set the capabilities and start `migrate` into the stream file."""
        self.open()
        q = self.qmp
        state = (q.execute("query-migrate") or {}).get("status")
        if state in ("setup", "active", "pre-switchover", "device", "wait-unplug", "cancelling"):
            raise BranchError(f"a migration is already running on this VM (status {state})",
                              hint="another branch of this child is in flight; retry when it finished")
        t0 = time.perf_counter()
        try:
            set_caps(q, x_ignore_shared=False, background_snapshot=self.live)
        except ForkdError as exc:
            if self.live and "not compatible with guest memory" in exc.message:
                raise BranchError(f"live branch impossible: {exc.message}", hint=LIVE_HINT) from exc
            raise
        self.timings["set_caps"] = (time.perf_counter() - t0) * 1000.0
        q.events.clear()
        q.execute("getfd", {"fdname": STREAM_FD_NAME}, fds=[self.fd])
        self.t_start = time.perf_counter()
        self.t_wall = time.time()
        q.execute("migrate", {"uri": f"fd:{STREAM_FD_NAME}"})
        self.timings["migrate_cmd"] = (time.perf_counter() - self.t_start) * 1000.0

    def wait_resumed(self, timeout: float = 60.0) -> None:
        """Live mode: return as soon as the source runs again (QEMU's STOP then RESUME events after migrate),
        i.e. device state is captured and RAM is write-protected; RAM keeps streaming in QEMU's thread."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.qmp.execute("query-migrate") or {}
            stop = [e for e in self.qmp.events if e.get("event") == "STOP"]
            stop = [self.paused_event] if self.paused_event else stop
            resume = [e for e in self.qmp.events if e.get("event") == "RESUME"]
            if stop and resume:
                self.resumed_at = time.perf_counter()
                self.timings["stop_event_after_migrate"] = (_event_time(stop[0]) - self.t_wall) * 1000.0
                self.stop_resume_ms = (_event_time(resume[-1]) - _event_time(stop[0])) * 1000.0
                return
            status = info.get("status")
            if status in ("failed", "cancelled"):
                raise BranchError(f"migration to the stream {status}: {info.get('error-desc', 'no reason given')}")
            if status == "completed":  # finished before we saw the events (tiny guests): it is running again
                self.resumed_at = time.perf_counter()
                return
            if time.monotonic() > deadline:
                raise BranchError(f"the source did not resume within {timeout:.0f}s of the branch start "
                                  f"(migration status {status})")
            time.sleep(0.0005)

    def wait_done(self, timeout: float = 600.0) -> dict:
        try:
            self.info = self.qmp.wait_migration(timeout=timeout, poll=0.005)
        except ForkdError as exc:
            raise BranchError(f"writing the branch stream failed: {exc.message}") from exc
        return self.info

    def cancel(self) -> None:
        """Best effort: stop a migration still in flight (e.g. after a timeout) and wait until it is over."""
        try:
            status = (self.qmp.execute("query-migrate") or {}).get("status")
            if status in ("setup", "active", "pre-switchover", "device"):
                self.qmp.execute("migrate_cancel")
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    if (self.qmp.execute("query-migrate") or {}).get("status") not in ("cancelling", "active",
                                                                                         "setup"):
                        break
                    time.sleep(0.01)
        except ForkdError:
            pass

    def restore_caps(self) -> None:
        """Back to what a restored child runs with."""
        set_caps(self.qmp, background_snapshot=False, x_ignore_shared=True)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def ensure_running(qmp: QMPClient) -> bool:
    """`cont` unless the VM runs already. True if it had to be resumed."""
    if run_state(qmp) == "running":
        return False
    qmp.execute("cont")
    return True


def convert(driver: QemuDriver, machine: Machine, stream: Path, memory: Path, vmstate: Path, work: Path,
            timeout: float = 300.0) -> dict[str, float]:
    """Load a full-RAM stream into a helper QEMU whose RAM is a new `share=on` file (`memory`), then save its
    device state only (`x-ignore-shared`) to `vmstate`. Returns step timings in ms. Stops the helper always."""
    work.mkdir(parents=True, exist_ok=True)
    files = RunFiles(work)
    empty = work / "initrd.empty"
    empty.touch()
    # as in QemuDriver.restore: the guest never reads its kernel again, the boot-header stub keeps the same ROMs
    machine = replace(machine, kernel=kernel_stub(machine.kernel, work / "kernel.stub"), initrd=empty)
    # -S: the stream comes from a *running* VM, so without it QEMU would start the guest once loaded, and the
    # guest would change memory.bin before we save the device state
    if machine.disk is not None:  # same devices as the source; the helper never runs the guest, so any overlay
        new_overlay(machine.disk, files.disk, driver.overlay_templates)
    argv = qemu_argv(driver.binary, machine, memory, files, share=True, incoming=True, sandbox=True,
                     disk=files.disk if machine.disk is not None else None) + ["-S"]
    fd = os.open(stream, os.O_RDONLY)
    timings: dict[str, float] = {}
    vm: Vm | None = None

    def start() -> None:
        nonlocal vm
        vm = driver._start(argv, files, pass_fds=(fd,))
        vm.qmp = QMPClient(files.qmp, timeout=30)

    def load() -> None:
        set_caps(vm.qmp, x_ignore_shared=False)
        vm.qmp.execute("migrate-incoming", {"uri": f"fd:{fd}"})
        vm.qmp.wait_migration(timeout=timeout, poll=0.01)

    try:
        run_steps([("convert_start", start), ("convert_load", load)], timings, "branch conversion",
                  on_error=lambda: driver._died(vm) if vm else "")
        os.close(fd)
        fd = -1
        t0 = time.perf_counter()
        driver.save(vm, vmstate)  # stop (a no-op), x-ignore-shared, device state to vmstate, quit
        timings["convert_save_state"] = (time.perf_counter() - t0) * 1000.0
        vm = None
    finally:
        if fd >= 0:
            os.close(fd)
        if vm is not None:
            driver.stop(vm)
    return timings

