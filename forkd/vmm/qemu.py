"""QEMU driver, using the fork recipe measured on this machine (see shared DESIGN.md):

* parent: q35 whose RAM is a `memory-backend-file` with `share=on`; saving pauses it and migrates only the
  device state (`x-ignore-shared`) into a file handed over as a descriptor (`getfd` + `fd:` URI);
* child: the same machine with `share=off` (a MAP_PRIVATE mapping of the parent's memory file) started with
  `-incoming defer` under a strict seccomp sandbox (`spawn=deny`, so the device state arrives as an inherited
  descriptor), then `migrate-incoming fd:N` and `cont`.

The command line it starts QEMU with and the identity QEMU drops to are forkd.vmm.qemu_cmdline's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from forkd.base import nsthread
from forkd.base.errors import ForkdError
from forkd.base.procs import kill_and_wait, start_time
from forkd.base.settings import settings
from forkd.base.steps import run_steps
from forkd.vmm import accel, capture, diff_capture, ksm, private_pages
from forkd.vmm.agent_client import AgentClient, AgentTimeout
from forkd.vmm.agent_replies import AgentError
from forkd.vmm.diff_capture import state_format_args
from forkd.vmm.disk import Qcow2Disks, new_overlay
from forkd.vmm.disk_fds import DiskFds, open_chain
from forkd.vmm.driver import Capture, Decision, DiffTaken, Machine, RunFiles, Vm, VmmDriver
from forkd.vmm.qemu_cmdline import (
    CONSOLE_DEV,
    CONSOLE_RING,
    SANDBOX,
    build_identity,
    kernel_stub,
    may_drop,
    netns_path,
    qemu_argv,
    unprivileged_uffd_problem,
    vmm_env,
)
from forkd.vmm.qmp import QMPClient

GUEST_STOPPED = ("shutdown", "guest-panicked", "internal-error")  # run states of a guest that will not boot


def find_qemu() -> str | None:
    return shutil.which(settings().qemu)


def tail(path: Path, n: int = 12) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def console_excerpt(console: Path, n: int = 20) -> str:
    """The part of a console log that says why a guest died: the lines up to the first kernel panic (the
    agent's own last words are just before it; the panic's backtrace after it says nothing new), else the tail."""
    try:
        lines = console.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    panic = next((i for i, line in enumerate(lines) if "Kernel panic" in line), None)
    end = len(lines) if panic is None else panic + 1
    return "\n".join(lines[max(0, end - n):end])


def _guest_stopped(vm: Vm) -> bool:
    if isinstance(vm.process, subprocess.Popen) and vm.process.poll() is not None:
        return True
    try:
        return capture.run_state(vm.qmp) in GUEST_STOPPED
    except (ForkdError, OSError):  # QMP gone: QEMU is exiting
        return True


def _boot_failed(vm: Vm, stopped: bool, timeout: float) -> ForkdError:
    """The error of a guest that did not come up, with what its console said (drained while QEMU lives)."""
    files = vm.files
    what = "the guest stopped while booting" if stopped else f"the guest agent did not answer within {timeout:g}s"
    save_console(vm.qmp, files.console)
    return ForkdError(f"{what}; the guest console ({files.console}) says:\n{console_excerpt(files.console)}\n"
                      f"QEMU log: {files.log}",
                      hint="a guest that stops while booting usually lacks something its agent needs (see the "
                           "console above); `forkd doctor` checks the host")


def save_console(qmp: QMPClient | None, console: Path) -> str:
    """Drain the guest's console ring (through QMP, while QEMU lives) into `console`, keeping its last
    CONSOLE_RING bytes, and return the file's tail. Best effort: a dead QEMU took its ring with it."""
    if qmp is not None:
        try:
            text = qmp.execute("ringbuf-read", {"device": CONSOLE_DEV, "size": CONSOLE_RING, "format": "utf8"},
                               timeout=5)
        except (ForkdError, OSError):
            text = ""
        if text or not console.exists():  # an empty console still gets its (empty) file: errors name it
            try:
                old = console.read_bytes()[-CONSOLE_RING:]
            except OSError:
                old = b""
            console.write_bytes((old + text.encode("utf-8", "replace"))[-CONSOLE_RING:])
    return tail(console)


def _running(vm: Vm | None) -> Callable[[], bool]:
    """Whether the VMM this process started for `vm` still runs (a connect stops waiting on one that exited)."""
    return lambda: vm is None or not isinstance(vm.process, subprocess.Popen) or vm.process.poll() is None


class QemuDriver(VmmDriver):
    name = "qemu"

    def __init__(self, binary: str | None = None, overlay_templates: Path | None = None):
        found = binary or find_qemu()
        if not found:
            raise ForkdError("qemu-system-x86_64 not found", hint="apt-get install qemu-system-x86")
        self.binary = found
        self.overlay_templates = overlay_templates  # where fresh child overlays are kept (forkd.vmm.disk)
        self._version: str | None = None
        self.seccomp_policy = SANDBOX
        self.disks = Qcow2Disks()

    def save_console(self, vm: Vm) -> str:
        return save_console(vm.qmp, vm.files.console)

    def probe_accel(self, kernel: Path, initrd: Path) -> Decision:
        return accel.probe(self.binary, kernel, initrd)

    def diff_capture_probe(self) -> tuple[bool, str]:
        return private_pages.probe()

    def page_merging(self) -> dict | None:
        return ksm.scanner_state()

    def version(self) -> str:
        if self._version is None:
            out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
            self._version = out.split("version", 1)[-1].split()[0] if "version" in out else "unknown"
        return self._version

    # -- process ---------------------------------------------------------------------------------
    def _start(self, argv: list[str], files: RunFiles, pass_fds: tuple[int, ...] = (), netns: str | None = None) -> Vm:
        """Start QEMU (born in network namespace `netns` when given and, under FORKD_VMM_JAIL, in a mount and a pid
        namespace of its own: forkd.base.nsthread.born_apart)."""
        files.dir.mkdir(parents=True, exist_ok=True)
        for f in (files.qmp, files.agent):
            f.unlink(missing_ok=True)
        ksm.inherit_merge(settings().vmm_ksm)
        with open(files.log, "wb") as log:
            proc = nsthread.born_apart(
                lambda: subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, pass_fds=pass_fds, close_fds=True, env=vmm_env()),
                netns=netns_path(netns) if netns else None, private=settings().vmm_jail)
        started = start_time(proc.pid)
        if started is None:
            proc.wait()
            raise ForkdError(f"QEMU exited at once (status {proc.returncode}):\n{tail(files.log)}")
        return Vm(pid=proc.pid, started=started, files=files, driver=self.name, process=proc)

    def _died(self, vm: Vm) -> str:
        proc = vm.process
        if isinstance(proc, subprocess.Popen):
            try:  # a QEMU that is failing is usually exiting right now: give it a moment
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        if isinstance(proc, subprocess.Popen) and proc.poll() is not None:
            return f"\nQEMU exited with status {proc.returncode}; its log ({vm.files.log}):\n{tail(vm.files.log)}"
        save_console(vm.qmp, vm.files.console)
        return f"\nQEMU log: {vm.files.log}; guest console: {vm.files.console}"

    def stop(self, vm: Vm) -> None:
        self.release(vm)
        if isinstance(vm.process, subprocess.Popen):
            vm.process.kill()
            vm.process.wait()
        else:
            kill_and_wait(vm.pid, vm.started)

    # -- running VMs this process did not start --------------------------------------------------
    def attach(self, files: RunFiles, pid: int | None, started: int | None) -> Vm:
        return Vm(pid=pid or 0, started=started or 0, files=files, driver=self.name)

    def connect(self, vm: Vm, timeout: float = 30.0) -> None:
        if vm.qmp is None:
            vm.qmp = QMPClient(vm.files.qmp, timeout=timeout)

    def _qmp(self, vm: Vm) -> QMPClient:
        if vm.qmp is not None and vm.qmp.broken:  # an answer timed out: its replies can no longer be matched
            vm.qmp = None
        self.connect(vm)
        return vm.qmp

    def release(self, vm: Vm) -> None:
        for client in (vm.qmp, vm.agent):
            if client is not None:
                client.close()
        vm.qmp = vm.agent = None

    def run_state(self, vm: Vm) -> str:
        return capture.run_state(self._qmp(vm))

    def pause(self, vm: Vm) -> None:
        self._qmp(vm).execute("stop")

    def ensure_running(self, vm: Vm) -> bool:
        return capture.ensure_running(self._qmp(vm))

    def may_drop(self, machine: Machine) -> bool:
        return may_drop(machine)

    def live_capture_problem(self, vm: Vm) -> tuple[str, str] | None:
        return capture.live_problem(vm.pid) or unprivileged_uffd_problem(vm.pid)

    def open_capture(self, vm: Vm, stream: Path, live: bool) -> Capture:
        return capture.QemuCapture(self._qmp(vm), stream, live)

    def diff_capture_problem(self, vm: Vm) -> tuple[str, str] | None:
        return diff_capture.problem()

    def written_pages(self, vm: Vm, mem_path: Path) -> int:
        self._same_vmm(vm)
        return diff_capture.written_pages(vm.pid, mem_path, mem_path.stat().st_size)

    def capture_diff(self, vm: Vm, mem_path: Path, vmstate: Path, pages: Path, data: Path,
                     while_paused: Callable[[], None] | None = None, written: int | None = None) -> DiffTaken:
        self._same_vmm(vm)
        size = mem_path.stat().st_size  # the flat image is guest RAM, whole
        return diff_capture.capture_diff(self._qmp(vm), vm.pid, mem_path, size, vmstate, pages, data, while_paused,
                                         written=written)

    @staticmethod
    def _same_vmm(vm: Vm) -> None:
        if start_time(vm.pid) != vm.started:  # its pages are read by pid: it must still be this VMM
            raise ForkdError(f"VMM {vm.pid} is gone (its pid now names another process, or none)")

    # -- boot ------------------------------------------------------------------------------------
    def boot(self, machine: Machine, mem_path: Path, files: RunFiles, timeout: float = 60.0,
             netns: str | None = None) -> Vm:
        net = " forkd.net=1" if machine.network != "none" else ""
        runas = build_identity(machine)
        fds = _disk_fds(machine.disk, runas, throwaway=False)
        argv = qemu_argv(self.binary, machine, mem_path, files, share=True, incoming=False, sandbox=True,
                         extra_cmdline=net.strip(), netns=netns, runas=runas, disk=machine.disk,
                         private_net=True, disk_fds=fds) + ["-S"]  # the guest starts (`cont`) once QEMU dropped root
        vm: Vm | None = None
        timings: dict[str, float] = {}
        described: list[bool] = []

        def start() -> None:
            nonlocal vm
            try:
                vm = self._start(argv, files, pass_fds=tuple(fds.fds) if fds else (), netns=netns)
            finally:
                if fds:
                    fds.close()

        def connect() -> None:
            vm.qmp = QMPClient(files.qmp, timeout=10, alive=_running(vm))  # answers from QEMU's main loop: after -runas
            vm.agent = AgentClient(files.agent, connect_timeout=10, alive=_running(vm))
            vm.qmp.execute("cont")

        def agent_ready() -> None:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    vm.agent.ping(timeout=1.0)
                    vm.qmp.execute("set-action", {"shutdown": "poweroff"})  # booted: a poweroff ends QEMU again
                    return
                except (AgentTimeout, OSError, ForkdError) as exc:  # no answer, or the guest closed its port
                    if isinstance(exc, AgentError):
                        raise
                    stopped = _guest_stopped(vm)
                    if stopped or time.monotonic() > deadline:
                        described.append(True)  # the error names the logs already
                        raise _boot_failed(vm, stopped, timeout) from None
                    if not isinstance(exc, AgentTimeout):
                        time.sleep(0.2)  # the port closed: the guest is stopping, or its agent restarting

        try:
            run_steps([("start_vmm", start), ("connect", connect), ("agent_ready", agent_ready)], timings,
                      "boot", on_error=lambda: self._died(vm) if vm and not described else "")
        except BaseException:
            if vm:
                self.stop(vm)
            raise
        vm.timings_ms.update(timings)
        return vm

    # -- save ------------------------------------------------------------------------------------
    def save(self, vm: Vm, state_path: Path) -> dict:
        qmp: QMPClient = vm.qmp
        info: dict = {}
        fd = os.open(state_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

        def pause() -> None:
            qmp.execute("stop")

        def migrate() -> None:
            # background-snapshot off: a child a live branch captured keeps it on (forkd.vmm.capture)
            capture.set_caps(qmp, x_ignore_shared=True, background_snapshot=False)
            qmp.execute("getfd", {"fdname": "state"}, fds=[fd])
            qmp.execute("migrate", {"uri": "fd:state"})
            info.update(qmp.wait_migration())

        def sync() -> None:
            os.fsync(fd)

        def quit_vmm() -> None:
            try:
                qmp.execute("quit")
            except ForkdError:
                pass  # QEMU may close the socket before answering
            if isinstance(vm.process, subprocess.Popen):
                vm.process.wait(timeout=10)
            else:
                kill_and_wait(vm.pid, vm.started)

        try:
            run_steps([("pause", pause), ("save_state", migrate), ("fsync_state", sync), ("quit", quit_vmm)],
                      vm.timings_ms, "save", on_error=lambda: self._died(vm))
        finally:
            os.close(fd)
        return info

    # -- restore ---------------------------------------------------------------------------------
    def restore(self, machine: Machine, mem_path: Path, state_path: Path, files: RunFiles,
                timeout: float = 30.0, on_start: Callable[[Vm], None] | None = None, share: bool = False,
                netns: str | None = None, runas: str | None = None) -> Vm:
        fd = os.open(state_path, os.O_RDONLY)
        files.dir.mkdir(parents=True, exist_ok=True)
        # The restored guest never reads its kernel or initramfs again, but QEMU would load both into every
        # child's heap (~50 MB each). It only needs a kernel whose boot header parses (so the same option ROM
        # exists as in the parent) and any initrd: give it the header alone and an empty file.
        empty = files.dir / "initrd.empty"
        empty.touch()
        machine = replace(machine, kernel=kernel_stub(machine.kernel, files.dir / "kernel.stub"), initrd=empty)
        if machine.disk is not None:
            new_overlay(machine.disk, files.disk, self.overlay_templates)
        runas = runas or build_identity(machine)  # layer builds name none
        disk = files.disk if machine.disk is not None else None
        fds = _disk_fds(disk, runas, throwaway=True)
        argv = qemu_argv(self.binary, machine, mem_path, files, share=share, incoming=True, sandbox=True,
                         netns=netns, runas=runas, disk=disk, private_net=share, disk_fds=fds)
        argv += state_format_args(state_path)
        vm: Vm | None = None
        timings: dict[str, float] = {}

        def start() -> None:
            nonlocal vm
            try:
                vm = self._start(argv, files, pass_fds=(fd, *(fds.fds if fds else ())), netns=netns)
            finally:
                if fds:
                    fds.close()
            if on_start:
                on_start(vm)

        def connect() -> None:
            vm.qmp = QMPClient(files.qmp, timeout=timeout, alive=_running(vm))
            # connect before the device state loads: the guest then never sees the agent port close
            vm.agent = AgentClient(files.agent, connect_timeout=timeout, alive=_running(vm))

        def load() -> None:
            vm.qmp.execute("migrate-set-capabilities",
                           {"capabilities": [{"capability": "x-ignore-shared", "state": True}]})
            vm.qmp.execute("migrate-incoming", {"uri": f"fd:{fd}"})
            vm.qmp.wait_migration(timeout=timeout)

        def resume() -> None:
            vm.qmp.execute("cont")

        try:
            run_steps([("start_vmm", start), ("connect", connect), ("load_state", load), ("resume", resume)],
                      timings, "restore", on_error=lambda: self._died(vm) if vm else "")
        except BaseException:
            if vm:
                self.stop(vm)
            raise
        finally:
            os.close(fd)
        vm.timings_ms.update(timings)
        return vm

    # -- branch: a captured stream into a snapshot ----------------------------------------------
    def stream_to_snapshot(self, machine: Machine, stream: Path, memory: Path, vmstate: Path, work: Path,
                           timeout: float = 300.0) -> dict[str, float]:
        """Load a full-RAM stream into a helper QEMU (same machine, `-S -incoming defer`) whose RAM is a new
        `share=on` file, `memory`, then save its device state only (`x-ignore-shared`) to `vmstate` with `save`.
        The result has the same shape as a snapshot made by booting a parent. Stops the helper always."""
        work.mkdir(parents=True, exist_ok=True)
        files = RunFiles(work)
        empty = work / "initrd.empty"
        empty.touch()
        # as in restore: the guest never reads its kernel again, the boot-header stub keeps the same ROMs
        machine = replace(machine, kernel=kernel_stub(machine.kernel, work / "kernel.stub"), initrd=empty)
        if machine.disk is not None:  # same devices as the source; the helper never runs the guest, so any overlay
            new_overlay(machine.disk, files.disk, self.overlay_templates)
        # -S: the stream comes from a *running* VM, so without it QEMU would start the guest once loaded, and the
        # guest would change `memory` before we save the device state
        runas = build_identity(machine)
        disk = files.disk if machine.disk is not None else None
        fds = _disk_fds(disk, runas, throwaway=True)
        argv = qemu_argv(self.binary, machine, memory, files, share=True, incoming=True, sandbox=True,
                         runas=runas, disk=disk, private_net=True, disk_fds=fds) + ["-S"] + state_format_args(stream)
        fd = os.open(stream, os.O_RDONLY)
        timings: dict[str, float] = {}
        vm: Vm | None = None

        def start() -> None:
            nonlocal vm
            try:
                vm = self._start(argv, files, pass_fds=(fd, *(fds.fds if fds else ())))
            finally:
                if fds:
                    fds.close()
            vm.qmp = QMPClient(files.qmp, timeout=30, alive=_running(vm))

        def load() -> None:
            capture.set_caps(vm.qmp, x_ignore_shared=False)
            vm.qmp.execute("migrate-incoming", {"uri": f"fd:{fd}"})
            vm.qmp.wait_migration(timeout=timeout, poll=0.01)

        try:
            run_steps([("convert_start", start), ("convert_load", load)], timings, "branch conversion",
                      on_error=lambda: self._died(vm) if vm else "")
            os.close(fd)
            fd = -1
            t0 = time.perf_counter()
            self.save(vm, vmstate)  # stop (a no-op), x-ignore-shared, device state to vmstate, quit
            timings["convert_save_state"] = (time.perf_counter() - t0) * 1000.0
            vm = None
        finally:
            if fd >= 0:
                os.close(fd)
            if vm is not None:
                self.stop(vm)
        return timings


def _disk_fds(disk: Path | None, runas: str | None, throwaway: bool) -> DiskFds | None:
    """The disk chain opened for a VMM that drops root (None: no disk, or a VMM that stays root and opens it)."""
    return open_chain(disk, throwaway=throwaway) if disk is not None and runas else None
