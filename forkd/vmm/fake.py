"""A VMM driver made of ordinary host processes, for tests of the logic above the driver (FORKD_VMM_DRIVER=fake).

Each "VM" is the real guest agent (forkd/guest, its op table and framing) run by `fake_guest.py` as a host process
chrooted into a directory of its own (`RunFiles.dir/root`, the host's programs bound in read-only), answering on
`RunFiles.agent` as a QEMU chardev does. Its "RAM" is what a snapshot needs to start it again: a tar of that root and
the journal of the Python it ran (eval / exec_code, replayed in order by a restored child: a warm interpreter),
padded with zeros to `Machine.memory_mib`. It meets CONTRACT.md's shape: `boot` over a shared memory file that
`save` writes, `restore` over a memory file it copies (private) or writes back on `save` (`share=True`), `on_start`
before the guest runs, pause / resume as SIGSTOP / SIGCONT of every process in that root, captures (live or
stopped) into a stream `stream_to_snapshot` turns into a snapshot, named steps, no process left on failure.

What it does not model (tests of these keep real VMs): isolation of any kind (the agent runs as root on the host,
with the host's /dev and /proc; never run untrusted code in it), copy-on-write memory (a child copies its root;
its memory costs are a host process's), entropy (a child reseeds its `random` module only), the guest's clock (it
is the host's: `clock` and `forked` set nothing), a network device (`isolated` machines get none; `netns` is only
where the process is born), root disks (`Machine.disk` is refused), dropping root (`may_drop` is False), diff
captures (no guest pages: `diff_capture_problem` says so), page-out, the guest kernel and its console (the console
log is the agent's output), live capture downtime (a live capture stops the guest while its root is archived;
nothing streams after the resume) and the one-control-channel rule (it has no control channel: `connect` only
checks the process is alive, `VmmLost` when it is gone). Interpreter state that is not the result of the journaled
code (threads, open files, state built by `exec` commands) is not in a snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from forkd import guest
from forkd.base import nsthread
from forkd.base.errors import ForkdError, InvalidInput
from forkd.base.procs import kill_and_wait, start_time
from forkd.base.steps import run_steps
from forkd.vmm.agent_client import AgentClient, AgentTimeout
from forkd.vmm.capture import CaptureError
from forkd.vmm.disk import Qcow2Disks
from forkd.vmm.driver import Capture, Decision, DiffTaken, Machine, RunFiles, Vm, VmmDriver, VmmLost

VERSION = "fake-1"
STATE_FORMAT = "forkd-fake-vmstate-1"
MIB = 1 << 20
GUEST_DIR = Path(guest.__file__).parent
LAUNCHER = Path(__file__).with_name("fake_guest.py")
# the guest's Python: the host's system Python 3 (a guest image's is Debian's), else the one running forkd
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)


def _root(files: RunFiles) -> Path:
    return files.dir / "root"


def _journal(files: RunFiles) -> Path:
    return files.dir / "journal"


def _meta(files: RunFiles) -> Path:
    return files.dir / "fake.json"


def guest_pids(root: Path) -> list[int]:
    """The processes whose root directory is `root`: the fake guest and everything it started."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(d / "root") == str(root):
                    pids.append(int(d.name))
    return pids


def _proc_state(pid: int, started: int) -> str | None:
    """The one-letter state of `pid` if it is still the process that started at `started`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] if int(fields[19]) == started else None


def _skip_unsafe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """A guest's own files: what the `data` filter refuses (links out, devices) is left out, not followed."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


def write_memory(files: RunFiles, dest: Path, size: int | None) -> None:
    """The VM's "RAM" (its root and journal) as a tar at `dest`, zero-padded to `size` bytes (None: unpadded)."""
    with open(dest, "wb") as f:
        with tarfile.open(fileobj=f, mode="w") as tar:
            tar.add(_journal(files), "journal")
            tar.add(_root(files), "root")
        end = f.tell()
        if size is not None:
            if end > size:
                raise ForkdError(f"the fake guest's root and journal ({end} bytes) outgrow its RAM ({size} bytes): "
                                 f"{dest}", hint="give the machine more memory_mib")
            f.truncate(size)
        os.fsync(f.fileno())


def read_memory(src: Path, files: RunFiles) -> None:
    """Unpack a memory file `write_memory` made into `files`' root and journal (a private copy)."""
    with tarfile.open(src, mode="r:") as tar:
        tar.extractall(files.dir, filter=_skip_unsafe)
    if not _journal(files).is_file():
        raise ForkdError(f"{src} is not a fake VM's memory (no journal in it)", hint="FORKD_VMM_DRIVER=fake made it?")


class FakeCapture(Capture):
    """A capture of a fake VM: its root and journal archived into the stream while every guest process is stopped."""

    def __init__(self, driver: FakeDriver, vm: Vm, stream: Path, live: bool):
        self.driver, self.vm, self.path, self.live = driver, vm, stream, live
        self.info, self.timings, self.stop_resume_ms, self.resumed_at = {}, {}, None, None
        self._lock = vm.files.dir / "capture.lock"
        self._held = False
        stream.touch()  # an unwritable destination fails here, before anything is paused

    def pause(self) -> None:
        self.driver.pause(self.vm)

    def start(self) -> None:
        try:
            os.close(os.open(self._lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            raise CaptureError(f"another capture of {self.vm.files.dir} is in flight") from None
        self._held = True
        t0 = time.perf_counter()
        was_running = self.driver.run_state(self.vm) == "running"
        self.driver.pause(self.vm)
        try:
            write_memory(self.vm.files, self.path, None)
        except OSError as exc:
            raise CaptureError(f"writing the capture stream {self.path} failed: {exc}") from exc
        finally:
            if self.live and was_running:
                self.driver.ensure_running(self.vm)
                self.resumed_at = time.perf_counter()
            took = (time.perf_counter() - t0) * 1000.0
            self.info = {"status": "completed", "downtime": took}
            self.stop_resume_ms = took if self.live else None
            self.timings["capture"] = took
            self._release()

    def _release(self) -> None:
        if self._held:
            self._lock.unlink(missing_ok=True)
            self._held = False

    def wait_stopped(self, timeout: float = 60.0) -> None:
        pass  # start() returned with the instant fixed

    def wait_resumed(self, timeout: float = 60.0) -> None:
        pass

    def wait_done(self, timeout: float = 600.0) -> dict:
        return self.info

    def cancel(self) -> None:
        self._release()

    def close(self) -> None:
        self._release()


class FakeDriver(VmmDriver):
    """VmmDriver over ordinary processes (the module's text says what it models and what not)."""

    name = "fake"
    boots_kernel = False

    def __init__(self) -> None:
        self.disks = Qcow2Disks()

    def version(self) -> str:
        return VERSION

    def save_console(self, vm: Vm) -> str:
        try:
            return "\n".join(vm.files.console.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def probe_accel(self, kernel: Path, initrd: Path) -> Decision:
        return Decision("tcg", "the fake driver runs no guest kernel", 0.0)

    def diff_capture_probe(self) -> tuple[bool, str]:
        return False, "the fake driver keeps no guest pages"

    # -- processes ---------------------------------------------------------------------------------------
    def _start(self, files: RunFiles, netns: str | None) -> Vm:
        files.dir.mkdir(parents=True, exist_ok=True)
        files.agent.unlink(missing_ok=True)
        _root(files).mkdir(exist_ok=True)
        _journal(files).touch()
        argv = [PYTHON, "-I", "-S", str(LAUNCHER), str(GUEST_DIR), str(_root(files)),
                str(files.agent), str(_journal(files))]
        where = nsthread.entered(f"/run/netns/{netns}") if netns else contextlib.nullcontext()
        with open(files.console, "ab") as console, where:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=console, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        started = start_time(proc.pid)
        if started is None:
            proc.wait()
            raise ForkdError(f"the fake guest exited at once (status {proc.returncode}); console: {files.console}")
        return Vm(pid=proc.pid, started=started, files=files, driver=self.name, process=proc)

    @staticmethod
    def _resume_guest(vm: Vm) -> None:
        vm.process.stdin.write(b"g")
        vm.process.stdin.close()

    def _agent_ready(self, vm: Vm, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                vm.agent.ping(timeout=1.0)
                return
            except (AgentTimeout, OSError, ForkdError):
                if vm.process.poll() is not None or time.monotonic() > deadline:
                    what = "exited" if vm.process.poll() is not None else f"did not answer within {timeout:g}s"
                    raise ForkdError(f"the fake guest {what}; its console ({vm.files.console}) says:\n"
                                     f"{self.save_console(vm)}") from None

    def _write_meta(self, files: RunFiles, mem_path: Path, share: bool, machine: Machine) -> None:
        _meta(files).write_text(json.dumps({"mem_path": str(mem_path), "share": share,
                                            "memory_mib": machine.memory_mib}))

    def _run(self, steps: list, timings: dict[str, float], what: str, vm_of: Callable[[], Vm | None]) -> None:
        try:
            run_steps(steps, timings, what, on_error=lambda: f"\nfake guest console: {vm_of().files.console}"
                      if vm_of() else "")
        except BaseException:
            if vm_of():
                self.stop(vm_of())
            raise

    def boot(self, machine: Machine, mem_path: Path, files: RunFiles, timeout: float = 60.0,
             netns: str | None = None) -> Vm:
        if machine.disk is not None:
            raise InvalidInput("the fake driver models no root disk (Machine.disk)", hint="FORKD_VMM_DRIVER=qemu")
        with open(mem_path, "ab") as f:  # the VM's RAM, shared: `save` writes it
            f.truncate(machine.memory_mib * MIB)
        files.dir.mkdir(parents=True, exist_ok=True)
        self._write_meta(files, mem_path, True, machine)
        box: list[Vm] = []

        def start() -> None:
            box.append(self._start(files, netns))
            self._resume_guest(box[0])

        def connect() -> None:
            box[0].agent = AgentClient(files.agent, connect_timeout=timeout)

        timings: dict[str, float] = {}
        self._run([("start_vmm", start), ("connect", connect), ("agent_ready", lambda: self._agent_ready(box[0],
                   timeout))], timings, "boot", lambda: box[0] if box else None)
        box[0].timings_ms.update(timings)
        return box[0]

    def save(self, vm: Vm, state_path: Path) -> dict:
        meta = json.loads(_meta(vm.files).read_text())
        if not meta["share"]:
            raise ForkdError(f"save: {vm.files.dir} maps its memory private (a child); only a booted VM or one "
                             "restored with share=True is saved", hint="branch a child instead")

        def save_state() -> None:
            write_memory(vm.files, Path(meta["mem_path"]), meta["memory_mib"] * MIB)
            state_path.write_text(json.dumps({"format": STATE_FORMAT, "version": VERSION}))

        def fsync_state() -> None:
            with open(state_path, "rb") as f:
                os.fsync(f.fileno())

        run_steps([("pause", lambda: self.pause(vm)), ("save_state", save_state), ("fsync_state", fsync_state),
                   ("quit", lambda: self.stop(vm))], vm.timings_ms, "save",
                  on_error=lambda: f"\nfake guest console: {vm.files.console}")
        return {}

    @staticmethod
    def _check_state(state_path: Path) -> None:
        try:
            state = json.loads(state_path.read_bytes()[:4096])
        except (OSError, ValueError) as exc:
            raise ForkdError(f"{state_path} is not a fake VM's device state: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ForkdError(f"{state_path} is not a fake VM's device state (format {STATE_FORMAT} expected)",
                             hint="a snapshot made by another driver is restored by that driver")

    def restore(self, machine: Machine, mem_path: Path, state_path: Path, files: RunFiles,
                timeout: float = 30.0, on_start: Callable[[Vm], None] | None = None, share: bool = False,
                netns: str | None = None, runas: str | None = None) -> Vm:
        self._check_state(state_path)
        files.dir.mkdir(parents=True, exist_ok=True)
        box: list[Vm] = []

        def start() -> None:
            read_memory(mem_path, files)  # a private copy, whatever `share` says: `save` writes it back
            self._write_meta(files, mem_path, share, machine)
            box.append(self._start(files, netns))
            if on_start:
                on_start(box[0])

        def connect() -> None:
            box[0].agent = AgentClient(files.agent, connect_timeout=timeout)

        def resume() -> None:
            self._resume_guest(box[0])
            self._agent_ready(box[0], timeout)

        timings: dict[str, float] = {}
        self._run([("start_vmm", start), ("connect", connect), ("load_state", lambda: None), ("resume", resume)],
                  timings, "restore", lambda: box[0] if box else None)
        box[0].timings_ms.update(timings)
        return box[0]

    def stop(self, vm: Vm) -> None:
        self.release(vm)
        if start_time(vm.pid) == vm.started:
            for pid in guest_pids(_root(vm.files)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if isinstance(vm.process, subprocess.Popen):
            with contextlib.suppress(ProcessLookupError):
                vm.process.kill()
            vm.process.wait()
        else:
            kill_and_wait(vm.pid, vm.started)

    # -- running VMs this process did not start --------------------------------------------------------
    def attach(self, files: RunFiles, pid: int | None, started: int | None) -> Vm:
        return Vm(pid=pid or 0, started=started or 0, files=files, driver=self.name)

    def connect(self, vm: Vm, timeout: float = 30.0) -> None:
        self.run_state(vm)  # no control channel: the process itself is asked

    def release(self, vm: Vm) -> None:
        if vm.agent is not None:
            vm.agent.close()
        vm.agent = None

    def run_state(self, vm: Vm) -> str:
        state = _proc_state(vm.pid, vm.started)
        if state is None or state in "ZX":
            raise VmmLost(f"the fake VMM {vm.pid} ({vm.files.dir}) is gone")
        return "paused" if state in "Tt" else "running"

    def _signal_guest(self, vm: Vm, sig: int, want: str) -> None:
        for pid in guest_pids(_root(vm.files)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5.0
        while self.run_state(vm) != want:  # the signal is delivered asynchronously: wait until the process shows it
            if time.monotonic() > deadline:
                raise ForkdError(f"the fake VMM {vm.pid} did not become {want} after {signal.Signals(sig).name}")
            time.sleep(0.001)

    def pause(self, vm: Vm) -> None:
        self._signal_guest(vm, signal.SIGSTOP, "paused")

    def ensure_running(self, vm: Vm) -> bool:
        (vm.files.dir / "capture.lock").unlink(missing_ok=True)  # a capture in flight ends with its process
        if self.run_state(vm) == "running":
            return False
        self._signal_guest(vm, signal.SIGCONT, "running")
        return True

    def may_drop(self, machine: Machine) -> bool:
        return False

    # -- captures ------------------------------------------------------------------------------------------
    def live_capture_problem(self, vm: Vm) -> tuple[str, str] | None:
        return None

    def open_capture(self, vm: Vm, stream: Path, live: bool) -> Capture:
        self.run_state(vm)
        return FakeCapture(self, vm, stream, live)

    def diff_capture_problem(self, vm: Vm) -> tuple[str, str] | None:
        return ("the fake driver keeps no guest pages, so there is nothing to diff",
                "branch with --mode live or --mode full, or FORKD_VMM_DRIVER=qemu")

    def written_pages(self, vm: Vm, mem_path: Path) -> int:
        raise ForkdError("the fake driver keeps no guest pages", hint="FORKD_VMM_DRIVER=qemu")

    def capture_diff(self, vm: Vm, mem_path: Path, vmstate: Path, pages: Path, data: Path,
                     while_paused: Callable[[], None] | None = None, written: int | None = None) -> DiffTaken:
        raise ForkdError("the fake driver keeps no guest pages to diff", hint="FORKD_VMM_DRIVER=qemu")

    def stream_to_snapshot(self, machine: Machine, stream: Path, memory: Path, vmstate: Path, work: Path,
                           timeout: float = 300.0) -> dict[str, float]:
        work.mkdir(parents=True, exist_ok=True)
        files = RunFiles(work)
        timings: dict[str, float] = {}
        try:
            run_steps([("convert_start", lambda: None), ("convert_load", lambda: read_memory(stream, files)),
                       ("convert_save_state", lambda: (write_memory(files, memory, machine.memory_mib * MIB),
                                                       vmstate.write_text(json.dumps({"format": STATE_FORMAT,
                                                                                      "version": VERSION}))))],
                      timings, "branch conversion")
        finally:
            shutil.rmtree(_root(files), ignore_errors=True)
        return timings
