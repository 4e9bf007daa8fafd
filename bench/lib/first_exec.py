"""`bench/wake.py --defaults`: an idle child's first exec, and what it costs while idle, as a fresh install gets it
before and now, side by side in one run (variants interleaved, so the host's other load hits each alike).

Variants (`DEFAULTS`): the settings each one sets (None: unset, so this tree's default) and whether the host has
the zram swap scripts/setup.sh makes (the daemon's sweeper then pages idle children out; without it nothing is).
Each round forks `n` children of the variant, lets them idle (`idle_s` instead of FORKD_IDLE_PAGEOUT_SECS's 60, so
a run is short; the sweeper thread is the daemon's own code, forkd.core.idle), reads their memory, then runs one
`exec true` on every child in random order: every sample is a child's first exec since it went idle."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, nullcontext

from density import exec_latencies, pct

from forkd.core.requests import Spawn
from lib.density_probes import mem_available_kib, memory_now, zram_used_kib
from lib.sweeper import Sweeper, progress

# name -> (settings, zram swap); the old defaults were FORKD_PRIME and FORKD_IDLE_SLEEP off
DEFAULTS: dict[str, tuple[dict[str, str | None], bool]] = {
    "before, no swap": ({"FORKD_PRIME": "0", "FORKD_IDLE_SLEEP": "0"}, False),  # a fresh install, before
    "before, zram": ({"FORKD_PRIME": "0", "FORKD_IDLE_SLEEP": "0"}, True),  # the old defaults on a host with zram
    "now (setup.sh)": ({"FORKD_PRIME": None, "FORKD_IDLE_SLEEP": None}, True),  # this tree's defaults, as set up
}


@contextmanager
def settings_of(values: dict[str, str | None]):
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def one_round(rt, tag: str, name: str, n: int, idle_s: float) -> dict:
    """Fork `n` children under variant `name`, let them idle (paged out if it has zram), then one exec each."""
    values, zram = DEFAULTS[name]
    with settings_of(values):
        avail0, zram0 = mem_available_kib(), zram_used_kib()
        recs: list = []
        try:
            while len(recs) < n:
                recs += rt.fork(Spawn.of(tag=tag, n=min(50, n - len(recs)), timeout=300.0))
            with Sweeper(rt, idle_s) if zram else nullcontext() as sweeper:
                paged = sweeper.wait_paged(recs, limit_s=300.0) if sweeper else None
                if sweeper is None:
                    time.sleep(idle_s + 2.0)  # idle as long as the others, for the memory read alike
                mem = memory_now(recs, avail0, zram0)
                split: dict[str, float] = {}
                lat = exec_latencies(rt, [r.id for r in recs], len(recs), split)
        finally:
            rt.kill([r.id for r in recs])
    row = {"samples": [round(x, 1) for x in lat], "own_per_child_mib": mem["own_per_child_mib"],
           "pss_per_child_mib": mem["pss_per_child_mib"], "mem_per_child_mib": mem["mem_per_child_mib"],
           "fork_ready_ms_p50": pct([r.timings_ms.get("ready", 0.0) for r in recs], 50), "pageout": paged,
           "primed": sum(1 for r in recs if "prime" in r.timings_ms),
           # CPU per exec (clock ticks: 10 ms steps, summed): the exec'd child's VMM, and this process (the request,
           # the page-in thread, the sweeper); it moves much less with the host's other load than the wall time
           "cpu_ms_per_exec": {k: round(v / max(1, len(lat)), 1) for k, v in split.items()}}
    progress(f"{name}: first exec p50 {pct(lat, 50):.1f} p99 {pct(lat, 99):.1f} ms, {row['own_per_child_mib']:.1f} "
             f"MiB per idle child (Pss + zram), ready p50 {row['fork_ready_ms_p50']:.0f} ms")
    return row


def compare(rt, tag: str, n: int, rounds: int, idle_s: float) -> dict:
    names = list(DEFAULTS)
    rows: dict[str, list[dict]] = {k: [] for k in names}
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else reversed(names):
            rows[name].append(one_round(rt, tag, name, n, idle_s))
    out = {}
    for name, rs in rows.items():
        lat = [x for r in rs for x in r["samples"]]
        out[name] = {"settings": DEFAULTS[name][0], "zram": DEFAULTS[name][1], "first_exec_n": len(lat),
                     "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99), "max_ms": max(lat),
                     "own_per_child_mib": pct([r["own_per_child_mib"] for r in rs], 50),
                     "mem_per_child_mib": pct([r["mem_per_child_mib"] for r in rs], 50),
                     "fork_ready_ms_p50": pct([r["fork_ready_ms_p50"] for r in rs], 50),
                     "vmm_cpu_ms_per_exec": pct([r["cpu_ms_per_exec"].get("vmm_ms", 0.0) for r in rs], 50),
                     "forkd_cpu_ms_per_exec": pct([r["cpu_ms_per_exec"].get("forkd_ms", 0.0) for r in rs], 50),
                     "rounds": rs}
    return out


def table(r: dict) -> str:
    m = r["machine"]
    lines = [f"forkd first exec of an idle child, before and now ({r['n']} children per variant and round, "
             f"{r['rounds']} rounds interleaved, idle {r['idle_s']:g} s; {m['nproc']} cores, accel {m['accel']}, "
             f"load {m['loadavg_at_start'][0]:.1f} -> {m['loadavg_at_end'][0]:.1f})",
             f"  {'variant':<17}{'execs':>6}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
             f"{'MiB/idle child':>16}{'ready p50 ms':>14}{'CPU ms/exec VMM+forkd':>23}"]
    for name, v in r["defaults"].items():
        lines.append(f"  {name:<17}{v['first_exec_n']:>6}{v['p50_ms']:>9.1f}{v['p90_ms']:>9.1f}{v['p99_ms']:>9.1f}"
                     f"{v['max_ms']:>9.1f}{v['own_per_child_mib']:>16.1f}{v['fork_ready_ms_p50']:>14.0f}"
                     f"{v['vmm_cpu_ms_per_exec']:>15.1f} + {v['forkd_cpu_ms_per_exec']:.1f}")
    return "\n".join(lines)
