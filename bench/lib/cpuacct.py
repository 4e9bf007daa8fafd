"""Host CPU of one side of a comparison, and the same CPU share for every side.

Each side gets a top-level group `forkd-bench-<pid>-<side>` in the cgroup v1 `cpuacct` and `cpu` hierarchies; every
process the bench starts for that side joins both, and their descendants inherit them (podman's containers and
conmon go in through `--cgroup-parent`). `cpuacct.usage` counts the CPU of all of them, including those that
already exited. The `cpu` group's weight is that of `weight` ordinary processes (cpu.shares 1024 each): on a host
where other sessions compete for the CPUs, every side then gets the same share, whatever it runs (a container's
processes, QEMU's threads, Inspect's own process). forkd's children must not sit in forkd's own `cpu:/forkd` group
for this (all of a host's children share one weight there): the benchmarks point FORKD_CGROUP_ROOT at an empty
directory, so forkd finds no hierarchy and starts its children unconstrained (no memory limit, as
`unconstrained: true` in their records says), in the side's group. On a host without these hierarchies
`CpuGroup.make` returns None and CPU is reported as not measured."""

from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
MOUNT = ROOT / "cpuacct"
HIERARCHIES = ("cpuacct", "cpu")


class CpuGroup:
    """One side's group, `forkd-bench-<pid>-<name>` in the cpuacct and cpu hierarchies."""

    def __init__(self, rel: str):
        self.rel = rel  # as `--cgroup-parent` takes it: a path from each hierarchy's root

    @classmethod
    def make(cls, name: str, weight: int = 1) -> CpuGroup | None:
        if not all((ROOT / h / "cgroup.procs").exists() for h in HIERARCHIES):
            return None
        group = cls(f"/forkd-bench-{os.getpid()}-{name}")
        try:
            group.ensure()
            (ROOT / "cpu" / group.rel.lstrip("/") / "cpu.shares").write_text(str(1024 * max(1, weight)))
        except OSError:
            return None
        return group

    @property
    def path(self) -> Path:
        """The cpuacct group (what `usage_s` reads)."""
        return MOUNT / self.rel.lstrip("/")

    def dirs(self) -> list[Path]:
        return [ROOT / h / self.rel.lstrip("/") for h in HIERARCHIES]

    def ensure(self) -> None:
        """Create the group where missing."""
        for d in self.dirs():
            d.mkdir(parents=True, exist_ok=True)

    def usage_s(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def join(self, pid: int | None = None) -> None:
        """Move `pid` (default: this process) into the group; its children started later inherit it."""
        self.ensure()
        for d in self.dirs():
            (d / "cgroup.procs").write_text(str(pid or os.getpid()))

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into the group (safe from threads, unlike preexec_fn)."""
        moves = " && ".join(f"echo $$ > {d}/cgroup.procs" for d in self.dirs())
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "cpu-join", *argv]

    def remove(self, timeout: float = 5.0) -> bool:
        """rmdir the group and the groups podman made under it, deepest first, once their processes are gone (in
        every hierarchy: podman's --cgroup-parent makes the group in each one)."""
        deadline = time.monotonic() + timeout
        for top in sorted(ROOT.glob(f"*/{self.rel.lstrip('/')}")):
            while top.exists():
                dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
                try:
                    for d in [*dirs, top]:
                        d.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.1)  # a container's last process is still exiting; nothing to wait on but the group
        return True


def leave() -> None:
    """Move this process back to the root of both hierarchies (before its groups are removed)."""
    for h in HIERARCHIES:
        (ROOT / h / "cgroup.procs").write_text(str(os.getpid()))


def no_forkd_cgroups(env: dict[str, str], empty_dir: str) -> None:
    """Have forkd start its children in the caller's groups (see the module's docstring)."""
    env["FORKD_CGROUP_ROOT"] = empty_dir


def join_env(env: dict[str, str]) -> None:
    """In a benchmark's child process: join the group named by BENCH_CPUACCT, if any (call before any work)."""
    if env.get("BENCH_CPUACCT"):
        CpuGroup(env["BENCH_CPUACCT"]).join()


def usage_of_env(env: dict[str, str]) -> float | None:
    return CpuGroup(env["BENCH_CPUACCT"]).usage_s() if env.get("BENCH_CPUACCT") else None
