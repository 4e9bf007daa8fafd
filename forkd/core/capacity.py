"""What this node can still take, for the operator's placement (GET /v1/node).

`memoryAvailableMiB` is the host's MemAvailable (children are copy-on-write: what they share with their snapshot is
not counted twice, what they dirtied is already gone from MemAvailable), capped by FORKD_NODE_MEMORY_MIB (a node
offering only part of its memory to forkd) less what its live children are counted for: each its memory limit, or
FORKD_PLACEMENT_CHILD_MIB without one (the same count the operator uses for a pool's need, so a node fills up as
the operator expects).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd.base.settings import settings

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

LIVE = ("running", "starting")


def meminfo_mib(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """MemTotal and MemAvailable in MiB (0 if the kernel does not say)."""
    out = {"MemTotal": 0, "MemAvailable": 0}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in out and rest.split():
            out[key] = int(rest.split()[0]) // 1024
    return out


def node_capacity(rt: Runtime) -> dict[str, Any]:
    mem = meminfo_mib()
    live = [c for c in rt.children() if c.status in LIVE]
    committed = sum(c.memory_limit_mib or settings().placement_child_mib for c in live)
    cap = settings().node_memory_mib
    available = mem["MemAvailable"] if cap is None else max(0, min(mem["MemAvailable"], cap - committed))
    pools: dict[str, int] = {}
    for c in live:
        if c.pool:
            pools[c.pool] = pools.get(c.pool, 0) + 1
    return {"memoryTotalMiB": mem["MemTotal"], "memoryAllocatableMiB": cap if cap is not None else mem["MemTotal"],
            "memoryAvailableMiB": available, "childrenRunning": len(live), "childrenCommittedMiB": committed,
            "pools": pools}
