"""Host CPU of one side of a comparison: a cgroup v1 `cpuacct` group the bench makes, which every process it
starts for that side joins (and their descendants inherit: forkd's VMMs stay in it, since forkd places them only in
the memory and cpu hierarchies; podman's containers and conmon go in through `--cgroup-parent`). The group's
`cpuacct.usage` counts the CPU of all of them, including those that already exited. On a host without a cpuacct
hierarchy `CpuGroup.make` returns None and the benchmarks report CPU as not measured."""

from __future__ import annotations

import os
import time
from pathlib import Path

MOUNT = Path("/sys/fs/cgroup/cpuacct")


class CpuGroup:
    """One cpuacct group, `/sys/fs/cgroup/cpuacct/<name>`."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def make(cls, name: str) -> CpuGroup | None:
        if not (MOUNT / "cpuacct.usage").exists():
            return None
        path = MOUNT / f"forkd-bench-{os.getpid()}-{name}"
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        return cls(path)

    @property
    def rel(self) -> str:
        """The group as `--cgroup-parent` takes it (a path from the hierarchy's root)."""
        return "/" + str(self.path.relative_to(MOUNT))

    def usage_s(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def join(self, pid: int | None = None) -> None:
        """Move `pid` (default: this process) into the group; its children started later inherit it."""
        (self.path / "cgroup.procs").write_text(str(pid or os.getpid()))

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into the group (safe from threads, unlike preexec_fn)."""
        return ["/bin/sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "cpuacct-join", *argv]

    def remove(self, timeout: float = 5.0) -> bool:
        """rmdir the group and the groups podman made under it, deepest first, once their processes are gone."""
        deadline = time.monotonic() + timeout
        while True:
            dirs = sorted((p for p in self.path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            try:
                for d in [*dirs, self.path]:
                    d.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)  # a container's last process is still exiting; nothing to wait on but the group


def join_env(env: dict[str, str]) -> None:
    """In a benchmark's child process: join the group named by BENCH_CPUACCT, if any (call before any work)."""
    p = env.get("BENCH_CPUACCT")
    if p:
        CpuGroup(Path(p)).join()


def usage_of_env(env: dict[str, str]) -> float | None:
    p = env.get("BENCH_CPUACCT")
    return CpuGroup(Path(p)).usage_s() if p else None
