"""What bench/density.py reads from the host: MemAvailable, a process's Pss, VmSwap and CPU time, zram's use, and
the children's memory figures built from them (a module of its own so density.py keeps to the benchmark's steps)."""

from __future__ import annotations

import time
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.core.idle import CLK_TCK, cpu_ticks
from forkd.vmm.pageout import meminfo_kib


def mem_available_kib() -> int:
    kib = meminfo_kib("MemAvailable")
    if not kib:
        raise ForkdError("no MemAvailable in /proc/meminfo (Linux before 3.14?)")
    return kib


def proc_field_kib(pid: int, name: str, field: str) -> int:
    """One `Field:  N kB` line of /proc/PID/<name> (smaps_rollup, status), or 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def pss_kib(pid: int) -> int:
    """The process's Pss (all mappings)."""
    return proc_field_kib(pid, "smaps_rollup", "Pss")


def swap_kib(pid: int) -> int:
    """The process's pages in swap (VmSwap)."""
    return proc_field_kib(pid, "status", "VmSwap")


def idle_cpu_pct(pids: list[int], seconds: float) -> float:
    """Summed CPU of `pids` over `seconds` of nothing asked of them, in % of one core (a process gone counts 0)."""
    t0, c0 = time.monotonic(), sum(cpu_ticks(p) or 0 for p in pids)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), sum(cpu_ticks(p) or 0 for p in pids)
    return (c1 - c0) / CLK_TCK / (t1 - t0) * 100.0


def host_busy_ms() -> float:
    """CPU time the host's cores spent busy since boot (user, nice, system, irq, softirq of /proc/stat), in ms."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) * 1000.0 / CLK_TCK


def zram_used_kib() -> int:
    """RAM the host's zram devices use for what they hold (mem_used_total of every /sys/block/zram*/mm_stat)."""
    return sum(int(stat.read_text().split()[2]) // 1024 for stat in Path("/sys/block").glob("zram*/mm_stat"))


def memory_now(recs: list, avail0: int, zram0: int) -> dict:
    """Host memory of the children now: MemAvailable drop, summed Pss, swapped, Pss + zram's growth, per child."""
    pids, n = [r.pid for r in recs], len(recs)
    drop = (avail0 - mem_available_kib()) / 1024.0
    pss = sum(pss_kib(p) for p in pids) / 1024.0
    swapped = sum(swap_kib(p) for p in pids) / 1024.0
    return {"mem_available_drop_mib": round(drop, 1), "mem_per_child_mib": round(drop / n, 2),
            "pss_sum_mib": round(pss, 1), "pss_per_child_mib": round(pss / n, 2),
            "swap_per_child_mib": round(swapped / n, 2),
            "own_per_child_mib": round((pss + (zram_used_kib() - zram0) / 1024.0) / n, 2)}
