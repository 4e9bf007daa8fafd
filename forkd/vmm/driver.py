"""The VMM driver interface, the machine description and the running-VM handle.

A driver boots a parent, saves it (device state beside a memory file it leaves as the immutable base),
restores children over that memory file mapped private, and captures a running child (live or stopped) into a
stream it then turns into a forkable snapshot (BRANCH). Each operation is a list of named, ordered steps
(forkd.base.steps) whose durations are kept, so errors and benchmarks can name them. The contract a driver must
meet, operation by operation, is written down in CONTRACT.md beside this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.errors import ForkdError

AGENT_PORT = "forkd.agent"
# the host side of an `isolated` machine's one NIC: every driver attaches it to the tap device of this name in the
# network namespace it is given (forkd.sandbox.netns makes it, forkd.sandbox.firewall filters it)
TAP_NAME = "tap0"


class VmmLost(ForkdError):
    """The VMM a handle names is gone (killed, crashed, or its control channel closed mid-operation). Drivers raise
    it (or a subclass: QEMU's lost QMP connection, a closed agent connection) so a caller tells a lost VMM from a
    failed operation by type, and reports the child's fate."""


@dataclass(frozen=True)
class Decision:
    """The accelerator a driver chose for a kernel (VmmDriver.probe_accel): kvm or tcg, and why."""

    accel: str
    reason: str
    probe_seconds: float


@dataclass(frozen=True)
class Machine:
    """What to run: the same description is used to boot a parent and to restore its children."""

    kernel: Path
    initrd: Path
    memory_mib: int = 512
    vcpus: int = 1
    accel: str = "tcg"
    cmdline: str = "console=ttyS0 quiet panic=-1"
    network: str = "none"  # none | isolated: isolated machines get one virtio-net NIC (see qemu_argv)
    # disk-backed images: the root disk (one virtio-blk device). A parent boots on it writable; a restored child
    # gets a private copy-on-write overlay on it (forkd.vmm.disk), so it is never written through a child.
    disk: Path | None = None


@dataclass(frozen=True)
class RunFiles:
    """Per-VM runtime files, all in one private directory."""

    dir: Path

    @property
    def qmp(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def agent(self) -> Path:
        return self.dir / "agent.sock"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    @property
    def log(self) -> Path:
        return self.dir / "qemu.log"

    @property
    def disk(self) -> Path:
        """A restored VM's private copy-on-write overlay (disk-backed images only)."""
        return self.dir / "disk.qcow2"


@dataclass
class Vm:
    """A running VMM process. `started` is its start time in clock ticks (pid-reuse-proof identity)."""

    pid: int
    started: int
    files: RunFiles
    driver: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    process: object = None  # subprocess.Popen when this process started it
    qmp: object = None  # QMPClient while connected
    agent: object = None  # AgentClient while connected


class DiffTaken(ABC):
    """A diff capture whose pause is over (VmmDriver.capture_diff)."""

    timings: dict[str, float]  # ms so far: `pause`, ...; `write` adds its own

    @abstractmethod
    def write(self) -> int:
        """Write the captured pages to their files (after the VM runs again); returns how many."""

    @abstractmethod
    def discard(self) -> None:
        """Drop what the capture still holds (its buffer, its open data file); a no-op once written."""


class Disks(ABC):
    """A driver's root-disk files (disk-backed images): copy-on-write overlays over a read-only base."""

    @abstractmethod
    def check_written(self, path: Path, backing: Path) -> None:
        """Refuse (ForkdError) an overlay a VMM wrote unless it is one the driver made over `backing` and opens no
        other file: called before anything running as root opens it."""

    @abstractmethod
    def create_overlay(self, dest: Path, backing: Path, relative: bool = True) -> None:
        """Make `dest` an empty overlay over `backing` (named relative to `dest`'s directory unless not `relative`)."""

    @abstractmethod
    def set_backing(self, path: Path, backing: Path, relative: bool = True) -> None:
        """Point the overlay `path` at `backing` without copying data (the same content lives there)."""

    @abstractmethod
    def rebase(self, path: Path, backing: Path) -> None:
        """Make the overlay `path` hold its difference to `backing` (data copied as needed), backed by it."""

    @abstractmethod
    def flatten(self, src: Path, dest: Path, base: Path) -> None:
        """Write `src`'s whole chain down to `base` as one overlay `dest` over `base`."""

    @abstractmethod
    def prune_templates(self, template_dir: Path, dry_run: bool = False) -> list[Path]:
        """Remove fresh-overlay templates whose base is gone; the paths removed (or that would be)."""


class VmmDriver(ABC):
    name: str
    binary: str | None = None  # the VMM program, for host checks (forkd doctor); None when there is none
    seccomp_policy: str | None = None  # the syscall filter the VMM applies to itself, for host checks
    boots_kernel: bool = True  # False: VMs never run the image's kernel and initramfs (a stub image will do)
    disks: Disks

    @abstractmethod
    def save_console(self, vm: Vm) -> str:
        """Drain what the VMM holds of `vm`'s console into `vm.files.console`; the text drained (best effort)."""

    @abstractmethod
    def probe_accel(self, kernel: Path, initrd: Path) -> Decision:
        """The accelerator VMs of this kernel run on here (a real boot probe where the VMM has a choice)."""

    @abstractmethod
    def diff_capture_probe(self) -> tuple[bool, str]:
        """Whether this host lets `capture_diff` work at all, and what was seen (forkd doctor). No VMM."""

    def page_merging(self) -> dict | None:
        """The host's page-merging scanner state (Linux KSM's counters), None when the kernel has none."""
        return None

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def boot(self, machine: Machine, mem_path: Path, files: RunFiles, timeout: float = 60.0,
             netns: str | None = None) -> Vm:
        """Start a parent over a shared memory file and wait until its agent answers."""

    @abstractmethod
    def save(self, vm: Vm, state_path: Path) -> dict:
        """Pause `vm`, write its device state to `state_path` (memory stays in the memory file), stop it."""

    @abstractmethod
    def restore(self, machine: Machine, mem_path: Path, state_path: Path, files: RunFiles,
                timeout: float = 30.0, on_start: Callable[[Vm], None] | None = None, share: bool = False,
                netns: str | None = None, runas: str | None = None) -> Vm:
        """Start a child mapping `mem_path` private (or shared, to build a layer in a copy of the image), load
        `state_path`, run it; `vm.agent` is connected.

        `on_start(vm)` runs as soon as the VMM process exists, so callers can record its pid first (and place it in
        a cgroup before the guest runs). `netns`: run the VMM in that (prepared) network namespace; `runas`
        ("uid:gid"): drop to that identity once files and sockets are open."""

    @abstractmethod
    def stop(self, vm: Vm) -> None:
        """Kill the VMM (if it is still the process `vm` names) and close this process's connections to it."""

    # -- running VMs this process did not start (BRANCH, recovery) -------------------------------------------
    @abstractmethod
    def attach(self, files: RunFiles, pid: int | None, started: int | None) -> Vm:
        """A handle on a running VMM recorded elsewhere (a child's RunFiles, pid and start time). No I/O: the
        control channel is opened by `connect` (or by the first operation that needs it)."""

    @abstractmethod
    def connect(self, vm: Vm, timeout: float = 30.0) -> None:
        """Open the control channel to `vm` (idempotent). Only one may be open per VM at a time."""

    @abstractmethod
    def release(self, vm: Vm) -> None:
        """Close this process's connections to `vm` and leave it running."""

    @abstractmethod
    def run_state(self, vm: Vm) -> str:
        """The VM's run state: "running", "paused", or the VMM's own word for another state."""

    @abstractmethod
    def pause(self, vm: Vm) -> None:
        """Stop `vm`'s vCPUs (the guest's time stands still too) until `ensure_running` resumes it: a sleeping
        child (forkd.sandbox.child)."""

    @abstractmethod
    def ensure_running(self, vm: Vm) -> bool:
        """Resume `vm` if a pause (ours, or that of a process that died) left it paused; a capture still in
        flight is cancelled first. True if it had to be resumed. The one "resume if paused"."""

    @abstractmethod
    def may_drop(self, machine: Machine) -> bool:
        """Whether a VMM for `machine` runs without root under FORKD_VMM_RUNAS=per-child (SECURITY.md section 7):
        a caller that names a `runas` identity for `restore` asks this first."""

    @abstractmethod
    def live_capture_problem(self, vm: Vm) -> tuple[str, str] | None:
        """Why `vm` cannot be captured live, as (reason, hint), or None if it can. No I/O on the VMM."""

    @abstractmethod
    def open_capture(self, vm: Vm, stream: Path, live: bool) -> Capture:
        """Create the stream file (an unwritable destination fails here, before anything is paused) and return
        the capture of `vm` into it; nothing runs until `Capture.start`."""

    @abstractmethod
    def diff_capture_problem(self, vm: Vm) -> tuple[str, str] | None:
        """Why a diff capture of `vm` cannot work here, as (reason, hint), or None if it can. No VMM I/O."""

    @abstractmethod
    def written_pages(self, vm: Vm, mem_path: Path) -> int:
        """How many guest pages `vm` holds a private copy of (wrote since its restore) in its mapping of
        `mem_path`: what a `capture_diff` would read while it is paused. No VMM I/O (its page tables are read);
        ForkdError when that cannot be said (the VMM is gone, or does not map `mem_path` once and whole)."""

    @abstractmethod
    def capture_diff(self, vm: Vm, mem_path: Path, vmstate: Path, pages: Path, data: Path,
                     while_paused: Callable[[], None] | None = None, written: int | None = None) -> DiffTaken:
        """Pause `vm` only while its device state (without RAM) goes to `vmstate` and the guest pages it wrote
        since its restore (its private copies of `mem_path`, the image it maps) are read; run `while_paused` then
        (e.g. a disk copy); resume it if it ran. The pause grows with the pages written, not with guest RAM.
        `DiffTaken.write()` (once it runs again) writes the pages to `pages` + `data` in the store's layer
        format; `DiffTaken.timings` in ms (`pause`, ...). `written`: what `written_pages` said just before, which
        sizes the page buffer without a scan of its own (more pages by then are still all read)."""

    @abstractmethod
    def stream_to_snapshot(self, machine: Machine, stream: Path, memory: Path, vmstate: Path, work: Path,
                           timeout: float = 300.0) -> dict[str, float]:
        """Turn a finished capture `stream` of a VM described by `machine` into a forkable snapshot: `memory` (the
        whole guest RAM, a file children can map) and `vmstate` (device state only). `work` is scratch space.
        Returns step timings in ms. Leaves no process behind."""


class Capture(ABC):
    """One capture of a running VM's whole state (device state + all of RAM) into a stream file.

    Live (`live=True`): the VM stops only while its device state is saved and its RAM write-protected, then runs
    while RAM streams out (`wait_resumed`, then `wait_done`). Stopped: the caller `pause`s it first; `wait_done`
    returns once everything is in the stream; the caller resumes it (VmmDriver.ensure_running)."""

    path: Path
    live: bool
    info: dict  # the VMM's report once done (e.g. "downtime" in ms)
    timings: dict[str, float]
    stop_resume_ms: float | None  # live: from the VM's stop to its resume, by the VMM's own clock
    resumed_at: float | None  # live: time.perf_counter() when the VM was seen running again (`wait_resumed`)

    @abstractmethod
    def pause(self) -> None:
        """Stop the VM before `start` (e.g. to copy its disk while nothing writes it); a live capture resumes it as
        soon as its device state is saved."""

    @abstractmethod
    def start(self) -> None:
        """Start writing the stream. Raises if another capture of this VM is in flight."""

    @abstractmethod
    def wait_stopped(self, timeout: float = 60.0) -> None:
        """Live: return once the VM stopped for the capture (the captured instant is fixed: nothing the guest does
        afterwards is in the stream); it resumes by itself (`wait_resumed`)."""

    @abstractmethod
    def wait_resumed(self, timeout: float = 60.0) -> None:
        """Live: return once the VM runs again (device state captured, RAM protected); RAM keeps streaming."""

    @abstractmethod
    def wait_done(self, timeout: float = 600.0) -> dict:
        """Return `info` once the whole stream is written; raise if it failed."""

    @abstractmethod
    def cancel(self) -> None:
        """Best effort: stop a capture still in flight and wait until it is over."""

    @abstractmethod
    def close(self) -> None:
        """Close the stream (idempotent). The VM keeps the capture settings (the next capture need not set them
        again); other uses of the VMM set their own."""

    @property
    def downtime_ms(self) -> float | None:
        return self.info.get("downtime")
