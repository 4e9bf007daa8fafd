"""The VMM driver interface, the machine description and the running-VM handle.

A driver boots a parent, saves it (device state beside a memory file it leaves as the immutable base) and
restores children over that memory file mapped private. Each operation is a list of named, ordered steps
(after firecracker-go-sdk's handlers) whose durations are kept, so errors and benchmarks can name them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.errors import ForkdError

AGENT_PORT = "forkd.agent"


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


class StepError(ForkdError):
    pass


def run_steps(steps: list[tuple[str, Callable[[], None]]], timings: dict[str, float], what: str,
              on_error: Callable[[], str] | None = None) -> None:
    """Run named steps in order, recording each one's duration in ms; a failure names its step."""
    for name, fn in steps:
        t0 = time.perf_counter()
        try:
            fn()
        except ForkdError as exc:
            extra = on_error() if on_error else ""
            raise StepError(f"{what}: step '{name}' failed: {exc.message}{extra}", hint=exc.hint) from exc
        except OSError as exc:
            extra = on_error() if on_error else ""
            raise StepError(f"{what}: step '{name}' failed: {exc}{extra}") from exc
        finally:
            timings[name] = (time.perf_counter() - t0) * 1000.0


class VmmDriver(ABC):
    name: str

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
    def stop(self, vm: Vm) -> None: ...
