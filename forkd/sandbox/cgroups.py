"""Per-child cgroups: a memory limit and a CPU weight for each child's VMM process.

Two layouts, found at run time:
  * cgroup v2 with the memory controller available (pure v2 at /sys/fs/cgroup, or a unified mount that has it):
    <root>/forkd/<home-hash>/<child>/{memory.max, cpu.weight, memory.events}
  * cgroup v1 (this machine: v1 controllers, a v2 hierarchy beside them without controllers):
    /sys/fs/cgroup/memory/forkd/<home-hash>/<child>/{memory.limit_in_bytes, memory.oom_control}
    /sys/fs/cgroup/cpu/forkd/<home-hash>/<child>/cpu.shares     (v2 weight 100 == v1 1024 shares)

<home-hash> keeps two FORKD_HOMEs on one host (tests, several daemons) from ever touching each other's groups;
`gc` only looks under its own.

Placement fails closed: `place()` raises if the pid did not land in every group (the caller kills the VMM and fails
the spawn) unless the caller explicitly allowed unconstrained children. The VMM is placed right after it starts,
before the device state loads and the guest runs: what QEMU allocated in its first milliseconds stays charged to
the parent group, every page the guest copies afterwards (and TCG's code buffer, filled at run time) is charged to
the child. With no swap, a child over its limit is OOM-killed inside its own group: only that VMM dies.

Shared guest RAM (the accounting model): a page of a tmpfs file is charged to the cgroup of whoever
allocates it first, and a child's MAP_PRIVATE fault on a *hole* of its flat image allocates that page in the
shared file. So every flat image is populated in full when it enters the flat cache, by a short helper process
placed in this home's own group <root>/forkd/<home-hash>/shared (`populate_shared`): the image is charged once,
there, at its full size, and no child ever allocates a page of it. A child's group is charged only for what the
child allocates itself: the guest pages it writes (private copies), its VMM's heap, its page tables. So
`memory_limit_mib` means the same for every child, whatever its siblings did, and a live branch (which reads every
guest page) adds nothing to its source's group.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.settings import settings

PREFIX = "forkd"
DEFAULT_CPU_WEIGHT = 100
SHARED = "shared"  # this home's group for shared guest RAM (flat images); child ids start with "c"
# The populate helper: join the shared group (argv[1]: its cgroup.procs; "" for none), then allocate every page of
# the inherited descriptor argv[2] up to argv[3] bytes (existing pages stay as they are). Exit 3: not placed.
_POPULATE = ("import os, sys\n"
             "procs, fd, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
             "if procs:\n"
             "    try:\n"
             "        with open(procs, 'w') as f:\n"
             "            f.write(str(os.getpid()))\n"
             "    except OSError as e:\n"
             "        print(e, file=sys.stderr)\n"
             "        sys.exit(3)\n"
             "os.posix_fallocate(fd, 0, size)\n")


class CgroupError(ForkdError):
    pass


def home_key(home: str) -> str:
    return "h" + hashlib.sha256(os.path.realpath(home).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    memory: Path  # root of the memory hierarchy (v2: the unified root)
    cpu: Path | None  # v1 cpu hierarchy; v2: same as memory when the cpu controller is on

    def base(self, home: str) -> list[Path]:
        roots = [self.memory] + ([self.cpu] if self.cpu is not None and self.cpu != self.memory else [])
        return [r / PREFIX / home_key(home) for r in roots]


def detect() -> Hierarchy | None:
    """The hierarchy that can limit memory here ($FORKD_CGROUP_ROOT), or None."""
    root = settings().cgroup_root
    for unified in (root, root / "unified"):
        try:
            controllers = (unified / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if "memory" in controllers:
            return Hierarchy(2, unified, unified if "cpu" in controllers else None)
    mem = root / "memory"
    if (mem / "memory.limit_in_bytes").exists():
        cpu = root / "cpu"
        return Hierarchy(1, mem, cpu if (cpu / "cpu.shares").exists() else None)
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _enable_v2_controllers(root: Path, leaf_parent: Path, want: tuple[str, ...]) -> None:
    """v2: controllers must be enabled in every ancestor's cgroup.subtree_control down to the leaf's parent."""
    d = root
    for part in leaf_parent.relative_to(root).parts:
        ctl = d / "cgroup.subtree_control"
        have = set(ctl.read_text().split())
        for c in want:
            if c not in have:
                with contextlib.suppress(OSError):
                    _write(ctl, f"+{c}")
        d = d / part
        d.mkdir(exist_ok=True)
    ctl = d / "cgroup.subtree_control"
    have = set(ctl.read_text().split())
    for c in want:
        if c not in have:
            with contextlib.suppress(OSError):
                _write(ctl, f"+{c}")


@dataclass(frozen=True)
class ChildCgroup:
    version: int
    paths: tuple[str, ...]  # one per hierarchy (v1: memory[, cpu]; v2: the one group)
    memory_limit_mib: int | None
    cpu_weight: int

    @property
    def memory_path(self) -> Path:
        return Path(self.paths[0])

    def place(self, pid: int) -> None:
        """Move `pid` into every group and check it arrived; raises CgroupError otherwise (fail closed)."""
        for p in self.paths:
            try:
                _write(Path(p) / "cgroup.procs", str(pid))
            except OSError as exc:
                raise CgroupError(f"cannot place pid {pid} in cgroup {p}: {exc}") from exc
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise CgroupError(f"pid {pid} is gone before it could be placed in its cgroup") from exc
        mine = {line.split(":", 2)[2] for line in lines}
        for p in self.paths:
            rel = "/" + str(Path(p).relative_to(_hierarchy_root(Path(p))))
            if rel not in mine:
                raise CgroupError(f"pid {pid} is not in cgroup {rel} after placement ({sorted(mine)})")
        if self.version == 1 and settings().vmm_detach:
            detach(pid, lines)

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this group (v1 memory.oom_control, v2 memory.events)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return read_oom_kills(self.memory_path / name)

    def pids(self) -> list[int]:
        out: list[int] = []
        for p in self.paths:
            out += procs(Path(p))
        return sorted(set(out))

    def remove(self, timeout: float = 2.0) -> bool:
        """rmdir every group (see remove_group); False if one still held a process at `timeout`."""
        return remove_group([Path(p) for p in self.paths], timeout)


def detach(pid: int, lines: list[str]) -> list[str]:
    """cgroup v1: move `pid` to the root of every hierarchy where it is in a group that is not forkd's (the daemon's
    container's, which it inherited), under FORKD_CGROUP_ROOT; `lines` are its /proc/PID/cgroup. A container runtime
    stopping the daemon's container signals every process of the container's groups (runc on v1: the devices
    hierarchy), so a VMM left there dies with the daemon's pod. Returns the hierarchies it was moved in; raises
    CgroupError if one refuses (the spawn fails: FORKD_VMM_DETACH asked for children that outlive the pod)."""
    root = settings().cgroup_root
    moved: list[str] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if path == "/" or path.startswith(f"/{PREFIX}/") or not controllers:  # a root, forkd's own, or v2's
            continue
        names = [controllers, *(c.removeprefix("name=") for c in controllers.split(","))]
        target = next((root / n for n in names if (root / n / "cgroup.procs").exists()), None)
        if target is None:
            raise CgroupError(f"FORKD_VMM_DETACH: no {controllers} hierarchy under {root} to move pid {pid} to",
                              hint="mount the host's cgroup hierarchy there (FORKD_CGROUP_ROOT)")
        try:
            _write(target / "cgroup.procs", str(pid))
        except OSError as exc:
            raise CgroupError(f"FORKD_VMM_DETACH: cannot move pid {pid} to {target}: {exc}") from exc
        moved.append(controllers)
    return moved


def _hierarchy_root(p: Path) -> Path:
    """The mount point a cgroup path lives under (the nearest ancestor named 'forkd''s parent)."""
    parts = p.parts
    i = len(parts) - 1 - list(reversed(parts)).index(PREFIX)
    return Path(*parts[:i])


def read_oom_kills(path: Path) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def procs(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_group(paths: list[Path], timeout: float = 2.0) -> bool:
    """rmdir each group (they must be empty: a just-killed process leaves them a moment later)."""
    ok = True
    for p in paths:
        deadline = time.monotonic() + timeout
        while True:
            try:
                p.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    ok = False
                    break
                time.sleep(0.01)
    return ok


def create(child_id: str, home: str, memory_limit_mib: int | None,
           cpu_weight: int = DEFAULT_CPU_WEIGHT) -> ChildCgroup:
    """Make the child's group(s) with the limit and weight set. Raises CgroupError when that is impossible."""
    if not 1 <= cpu_weight <= 10000:
        raise CgroupError(f"cpu weight {cpu_weight}: use 1..10000")
    h = detect()
    if h is None:
        raise CgroupError("no cgroup hierarchy with the memory controller is mounted",
                          hint="mount cgroup v2 with memory enabled, or the v1 memory controller")
    made: list[Path] = []
    try:
        if h.version == 2:
            g = h.base(home)[0] / child_id
            _enable_v2_controllers(h.memory, g.parent, ("memory", "cpu"))
            g.mkdir()
            made.append(g)
            if memory_limit_mib is not None:
                _write(g / "memory.max", str(memory_limit_mib << 20))
                with contextlib.suppress(OSError):  # no swap escape, where swap accounting exists
                    _write(g / "memory.swap.max", "0")
                with contextlib.suppress(OSError):
                    _write(g / "memory.oom.group", "1")
            if (g / "cpu.weight").exists():
                _write(g / "cpu.weight", str(cpu_weight))
            return ChildCgroup(2, (str(g),), memory_limit_mib, cpu_weight)
        groups = [b / child_id for b in h.base(home)]
        for g in groups:
            for attempt in range(3):  # gc may rmdir an empty home group between these two calls
                g.parent.mkdir(parents=True, exist_ok=True)
                try:
                    g.mkdir()
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            made.append(g)
        mem = groups[0]
        if memory_limit_mib is not None:
            _write(mem / "memory.limit_in_bytes", str(memory_limit_mib << 20))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                with contextlib.suppress(OSError):  # no swap escape either, where swap accounting exists
                    _write(mem / "memory.memsw.limit_in_bytes", str(memory_limit_mib << 20))
        if len(groups) > 1:
            _write(groups[1] / "cpu.shares", str(max(2, cpu_weight * 1024 // 100)))
        return ChildCgroup(1, tuple(str(g) for g in groups), memory_limit_mib, cpu_weight)
    except OSError as exc:
        remove_group(made, timeout=0.2)
        raise CgroupError(f"cannot create the cgroup of {child_id}: {exc}") from exc


def from_record(paths: list[str] | tuple[str, ...] | None) -> ChildCgroup | None:
    if not paths:
        return None
    version = 2 if (Path(paths[0]) / "cgroup.controllers").exists() else 1
    return ChildCgroup(version, tuple(paths), None, DEFAULT_CPU_WEIGHT)


def home_bases(home: str) -> list[Path]:
    h = detect()
    return h.base(home) if h is not None else []


def prune_empty_homes() -> list[str]:
    """rmdir every forkd/<home-hash> group with no child groups left (rmdir of a cgroup fails unless it is empty,
    and create() retries if a prune races it). Returns what went."""
    h = detect()
    gone: list[str] = []
    if h is None:
        return gone
    for root in {h.memory, h.cpu} - {None}:
        try:
            homes = [p for p in (root / PREFIX).iterdir() if p.is_dir() and p.name.startswith("h")]
        except FileNotFoundError:
            continue
        for p in homes:
            shared = p / SHARED
            if shared.is_dir() and not procs(shared) and shmem_bytes(shared) == 0:  # it holds no flat image
                with contextlib.suppress(OSError):
                    shared.rmdir()
            with contextlib.suppress(OSError):
                p.rmdir()
                gone.append(str(p))
    return gone


def shmem_bytes(group: Path) -> int:
    """tmpfs bytes charged to a memory group (memory.stat `shmem`, v1 and v2); -1 if unreadable."""
    try:
        for line in (group / "memory.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "shmem":
                return int(v)
    except (OSError, ValueError):
        pass
    return -1


def home_groups(home: str) -> list[Path]:
    """Every child group under this home's subtree, in every hierarchy (not the `shared` group of flat images)."""
    h = detect()
    if h is None:
        return []
    out: list[Path] = []
    for base in h.base(home):
        try:
            out += sorted(p for p in base.iterdir() if p.is_dir() and p.name != SHARED)
        except FileNotFoundError:
            continue
    return out


def shared_group(home: str) -> Path | None:
    """This home's group for shared guest RAM (made on first use; memory hierarchy only), or None without one."""
    h = detect()
    if h is None:
        return None
    g = h.base(home)[0] / SHARED
    try:
        if h.version == 2:
            _enable_v2_controllers(h.memory, g.parent, ("memory",))
        g.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return g


def is_populated(fd: int) -> bool:
    """True if every page of the open file is allocated (a tmpfs file no fault can grow)."""
    st = os.fstat(fd)
    return st.st_blocks * 512 >= st.st_size


def populate_shared(home: str, fd: int) -> str:
    """Allocate every page of the open tmpfs file `fd` (a flat image), charged to this home's `shared` group (see
    the module docstring). Where there is no such group, or the helper cannot join it, the pages are allocated by
    this process instead: never by a child. Returns the group charged ("" for this process's own)."""
    size = os.fstat(fd).st_size
    if is_populated(fd):
        return ""
    g = shared_group(home)
    if g is not None:
        try:
            res = subprocess.run([sys.executable, "-I", "-S", "-c", _POPULATE, str(g / "cgroup.procs"), str(fd),
                                  str(size)], pass_fds=(fd,), capture_output=True, text=True, timeout=300)
            if res.returncode == 0:
                return str(g)
        except (OSError, subprocess.TimeoutExpired):
            pass  # allocated here instead (a helper that failed for lack of space fails here the same way)
    os.posix_fallocate(fd, 0, size)
    return ""
