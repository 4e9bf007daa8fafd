"""QEMU's side of BRANCH: capture a *running* child into a stream (see shared DESIGN.md, "Live branch").

`QemuCapture`: on the running child's own QMP socket, migrate the whole VM (device state + all of RAM) into a
stream file handed over as a descriptor (`getfd` + `fd:NAME`: children run under `-sandbox ...,spawn=deny`, so
`exec:` URIs are forbidden). Children were restored with `x-ignore-shared` on; it is switched off first (a child's
RAM is a `share=off` mapping, so it is never "shared" anyway, but the flag must not leak into the stream format).
The capabilities a branch sets stay set afterwards: QEMU re-checks userfaultfd write-protect over all of guest RAM
whenever capabilities are set while `background-snapshot` is on (~25-150 ms, before the migration starts, so in a
`--no-wait` branch's return time), so a child's second and later live branches set nothing (`ensure_caps`).
Every other migration of a VM sets the capabilities it needs itself (`QemuDriver.save`).
In **live** mode the capability `background-snapshot` is on: QEMU stops the VM for a few ms, saves the device
state, arms userfaultfd write-protect on guest RAM *while stopped* and resumes it, then copies RAM out page by
page, copying a page first whenever the running guest writes it. Memory and device state are therefore from the
same instant, by QEMU's own construction (we never arm write-protect ourselves before a pause: that is
upstream's defect 5). In **stop** mode (`diff`/`full`) the VM is paused first and the same migration runs
against a stopped VM.

Memory accounting: QEMU never writes the stream file itself. It writes into a pipe, and a process
forkd starts (`StreamPump`, forkd.vmm.stream_pump, in forkd's memory group) splices the pipe into the file: the
file's pages (tmpfs or page cache, as big as the guest's RAM) are charged to forkd, never to the source child's
memory group, so a branch cannot push a memory-limited source over its limit. (The guest RAM the capture reads is
the child's flat image, populated and charged to forkd's own group when it was materialized: see
forkd.sandbox.cgroups.) The pump outlives the process that started the branch: see forkd.vmm.stream_pump for why.

Turning the stream into a snapshot is `QemuDriver.stream_to_snapshot` (forkd.vmm.qemu).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.vmm.driver import Capture
from forkd.vmm.qmp import QMPClient

STREAM_FD_NAME = "branch"
IN_FLIGHT = ("setup", "active", "pre-switchover", "device", "wait-unplug", "cancelling")
RESUMABLE = ("paused", "postmigrate", "finish-migrate")
EVENT_POLL = 0.05  # s: wait_resumed asks query-migrate only when no event came for this long

LIVE_HINT = ("QEMU's background snapshot write-protects guest RAM with userfaultfd, which Linux supports for "
             "anonymous, shmem (tmpfs) and hugetlbfs memory only; this child maps its snapshot's memory file from a "
             "regular filesystem. Keep FORKD_HOME (its snapshots) on tmpfs, e.g. /dev/shm, or use --mode full")


class CaptureError(ForkdError):
    pass


PUMP_CHUNK = 1 << 20
PUMP_JOIN_SECONDS = 60.0  # after QEMU said `completed` it closes its end of the pipe at once


class StreamPump:
    """Copy everything QEMU writes into a pipe to the stream file, in a process of its own
    (forkd.vmm.stream_pump: it outlives this process, so a kill -9 of the branching process never breaks QEMU's
    stream, which would hang the source). A write that fails (no space left) is remembered and the rest of the pipe
    is drained, so QEMU always reaches the end of its stream; the caller raises `error` once QEMU is done. Takes
    `rfd` (closed here once the pump has its copy) and a duplicate of the file descriptor."""

    def __init__(self, rfd: int, file_fd: int):
        with_suppressed(lambda: fcntl.fcntl(rfd, fcntl.F_SETPIPE_SZ, PUMP_CHUNK))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(Path(__file__).with_name("stream_pump.py")), str(rfd), str(file_fd)],
                pass_fds=(rfd, file_fd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                start_new_session=True)  # a signal to our process group (^C) must not break the stream
        finally:
            os.close(rfd)
        self._error: OSError | None = None
        self.copied = 0

    @property
    def error(self) -> OSError | None:
        """The failed write, once the pump has ended (None while it runs)."""
        if self.proc.poll() is not None and self.proc.stdout is not None:
            self._collect()
        return self._error

    def _collect(self) -> None:
        out, self.proc.stdout = self.proc.stdout.read(), (self.proc.stdout.close() or None)
        try:
            report = json.loads(out or b"{}")
        except ValueError:
            report = {}
        self.copied = int(report.get("copied", 0))
        if report.get("error"):
            self._error = OSError(*report["error"])
        elif self.proc.returncode != 0 and not report:
            self._error = OSError(f"the stream pump exited with status {self.proc.returncode}")

    def join(self, timeout: float = PUMP_JOIN_SECONDS) -> None:
        """Wait for the end of the stream; raise CaptureError if it did not come or a write failed."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise CaptureError(f"the VMM did not close the branch stream within {timeout:.0f}s of finishing it") \
                from None
        if self.error is not None:
            raise CaptureError(f"writing the branch stream failed: {self.error}",
                               hint="free space where the stream goes ($FORKD_HOME/tmp or the branch's tmp_dir)")


def with_suppressed(fn) -> None:
    try:
        fn()
    except OSError:
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


def live_problem(pid: int | None) -> tuple[str, str] | None:
    """Why the QEMU `pid` cannot be captured live (see LIVE_HINT), or None."""
    mem = vmm_memory_path(pid) if pid else None
    if mem is None or fs_type(mem) in ("tmpfs", "hugetlbfs", "ramfs"):
        return None
    return f"its memory file {mem} is on {fs_type(mem)}", LIVE_HINT


def set_caps(qmp: QMPClient, **caps: bool) -> None:
    qmp.execute("migrate-set-capabilities",
                {"capabilities": [{"capability": k.replace("_", "-"), "state": v} for k, v in caps.items()]})


def migration_caps(qmp: QMPClient) -> dict[str, bool]:
    return {c.get("capability"): bool(c.get("state")) for c in qmp.execute("query-migrate-capabilities") or []
            if isinstance(c, dict)}


def ensure_caps(qmp: QMPClient, **caps: bool) -> bool:
    """Set the capabilities among `caps` that are not already as asked (one query, and no set at all when none
    differs). True if something was set."""
    have = migration_caps(qmp)
    todo = {k: v for k, v in caps.items() if have.get(k.replace("_", "-")) != v}
    if todo:
        set_caps(qmp, **todo)
    return bool(todo)


def run_state(qmp: QMPClient) -> str:
    return (qmp.execute("query-status") or {}).get("status", "unknown")


def migration_status(qmp: QMPClient) -> str | None:
    return (qmp.execute("query-migrate") or {}).get("status")


def cancel_migration(qmp: QMPClient) -> None:
    """Best effort: stop a migration still in flight and wait (10 s at most) until it is over."""
    try:
        if migration_status(qmp) in ("setup", "active", "pre-switchover", "device"):
            qmp.execute("migrate_cancel")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and migration_status(qmp) in ("cancelling", "active", "setup"):
                time.sleep(0.01)
    except ForkdError:
        pass


def ensure_running(qmp: QMPClient) -> bool:
    """`cont` a VM a pause left paused (cancelling a capture still in flight first). True if it was resumed. Its
    run state and migration status are asked in one round trip (each one is a wake-up of QEMU's main loop)."""
    status, migration = qmp.batch([("query-status", None, None), ("query-migrate", None, None)])
    for answer in (status, migration):
        if isinstance(answer, Exception):
            raise answer
    state = (status or {}).get("status", "unknown")
    if state == "running":
        return False
    if (migration or {}).get("status") in IN_FLIGHT:
        cancel_migration(qmp)
        state = run_state(qmp)
    if state not in RESUMABLE:
        raise ForkdError(f"the VM is {state!r}, a state it cannot be resumed from")
    qmp.execute("cont")
    return True


def event_time(ev: dict) -> float:
    ts = ev.get("timestamp") or {}
    return ts.get("seconds", 0) + ts.get("microseconds", 0) / 1e6


class QemuCapture(Capture):
    """One migration of a running (live) or paused (stop) child into a stream file (see the module docstring)."""

    def __init__(self, qmp: QMPClient, path: Path, live: bool):
        self.qmp = qmp
        self.path = Path(path)
        self.live = live
        # created before anything is paused: an unwritable destination fails here
        self.fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.info: dict = {}
        self.t_start = 0.0
        self.resumed_at: float | None = None  # perf_counter when we saw the source run again (live mode)
        self.stop_resume_ms: float | None = None  # STOP -> RESUME event timestamps (QEMU's clock), live mode
        self.timings: dict[str, float] = {}
        self.paused_event: dict | None = None  # our own STOP, when the VM was paused before the stream (pause())
        self.pump: StreamPump | None = None

    def pause(self) -> None:
        """Stop the VM before the stream starts (a disk-backed source's disk is copied while it is paused); the
        live stream then resumes it as soon as its device state is saved."""
        self.qmp.events.clear()
        self.qmp.execute("stop")
        now = time.time()
        self.paused_event = next((e for e in self.qmp.events if e.get("event") == "STOP"), None) or {
            "event": "STOP", "timestamp": {"seconds": int(now), "microseconds": int(now % 1 * 1e6)}}

    def start(self) -> None:
        """Set the capabilities and start `migrate` into the stream file."""
        q = self.qmp
        state = migration_status(q)
        if state in IN_FLIGHT:
            raise CaptureError(f"a migration is already running on this VM (status {state})",
                              hint="another branch of this child is in flight; retry when it finished")
        t0 = time.perf_counter()
        try:
            ensure_caps(q, x_ignore_shared=False, background_snapshot=self.live)
        except ForkdError as exc:
            if self.live and "not compatible with guest memory" in exc.message:
                raise CaptureError(f"live branch impossible: {exc.message}", hint=LIVE_HINT) from exc
            raise
        self.timings["set_caps"] = (time.perf_counter() - t0) * 1000.0
        q.events.clear()
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        try:
            self.pump = StreamPump(rfd, self.fd)  # takes rfd, whatever happens
        except BaseException:
            os.close(wfd)
            raise
        try:  # QEMU writes the pipe; our copy of its end closes, so the pump sees the end when QEMU closes its own
            q.execute("getfd", {"fdname": STREAM_FD_NAME}, fds=[wfd])
        finally:
            os.close(wfd)
        self.t_start = time.perf_counter()
        self.t_wall = time.time()
        q.execute("migrate", {"uri": f"fd:{STREAM_FD_NAME}"})
        self.timings["migrate_cmd"] = (time.perf_counter() - self.t_start) * 1000.0

    def _stop_events(self) -> list[dict]:
        return [self.paused_event] if self.paused_event else [e for e in self.qmp.events if e.get("event") == "STOP"]

    def _resume_events(self) -> list[dict]:
        return [e for e in self.qmp.events if e.get("event") == "RESUME"]

    def _await(self, seen: Callable[[], bool], timeout: float, what: str) -> bool:
        """Wait until `seen()` (True), or the migration completed first (False; tiny guests finish before the
        events are read). Waits on the QMP socket for events; `query-migrate` only when none came for EVENT_POLL
        s (each query takes QEMU's main-loop lock, which the pause itself needs: polling every 0.5 ms
        lengthened it)."""
        deadline = time.monotonic() + timeout
        while not seen():
            if self.qmp.next_event(min(EVENT_POLL, max(0.0, deadline - time.monotonic()))) is not None:
                continue
            info = self.qmp.execute("query-migrate") or {}
            status = info.get("status")
            if status in ("failed", "cancelled"):
                raise CaptureError(f"migration to the stream {status}: {info.get('error-desc', 'no reason given')}")
            if status == "completed":
                return False
            if time.monotonic() > deadline:
                raise CaptureError(f"the source did not {what} within {timeout:.0f}s of the branch start "
                                  f"(migration status {status})")
        return True

    def wait_stopped(self, timeout: float = 60.0) -> None:
        """Live mode: return once the source stopped for the capture (QEMU's STOP after migrate): the instant the
        snapshot holds is fixed, nothing the guest does later is in it. It resumes by itself (wait_resumed)."""
        self._await(lambda: bool(self._stop_events()), timeout, "stop")

    def wait_resumed(self, timeout: float = 60.0) -> None:
        """Live mode: return as soon as the source runs again (QEMU's STOP then RESUME events after migrate),
        i.e. device state is captured and RAM is write-protected; RAM keeps streaming in QEMU's thread."""
        evented = self._await(lambda: bool(self._stop_events() and self._resume_events()), timeout, "resume")
        self.resumed_at = time.perf_counter()
        if evented:
            stop = self._stop_events()[0]
            self.timings["stop_event_after_migrate"] = (event_time(stop) - self.t_wall) * 1000.0
            self.stop_resume_ms = (event_time(self._resume_events()[-1]) - event_time(stop)) * 1000.0

    def wait_done(self, timeout: float = 600.0) -> dict:
        try:
            self.info = self.qmp.wait_migration(timeout=timeout, poll=0.005)
        except ForkdError as exc:
            cause: BaseException = exc
            if self.pump is not None and self.pump.error is not None:
                cause = self.pump.error  # what went wrong first: our write of the stream
            raise CaptureError(f"writing the branch stream failed: {cause}") from cause
        if self.pump is not None:
            self.pump.join()
        return self.info

    def cancel(self) -> None:
        cancel_migration(self.qmp)

    def close(self) -> None:
        """Close the stream file. The capabilities stay as the branch set them (see the module docstring)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
