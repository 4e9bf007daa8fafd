#!/usr/bin/env python3
"""Density benchmark: how many idle children this machine holds, and what each one costs while idle.

    python3 bench/density.py [--home DIR] [--n 300] [--batch 100] [--idle-s 30] [--execs 50] [--report FILE]
    python3 bench/density.py --n 1500                # the issue's figure (needs ~20 GiB free at today's cost)
    python3 bench/density.py --short                 # CI: 4 children in batches of 2, 2 s windows
    python3 bench/density.py --compare --n 24        # per-child cost of each VMM/guest variant, side by side

Forks N children of one warm snapshot in batches. After each batch: host memory per child (MemAvailable drop since
the start, and the summed Pss of the children's QEMU processes, VMM and guest pages included: shared pages of the
snapshot's memory file count once, split between the children mapping them), idle CPU per child (utime+stime of
every child's QEMU over a window in which nothing is asked of them), and exec latency (`exec true` over a fresh
connection, as `forkd exec` does) on random children while the others idle. At the end: the same over `--idle-s`
(30 s) and `--execs` requests at full N, and where this machine runs out: the N at which the children's memory
reaches MemAvailable at the start, the N at which their idle CPU fills every core, and the last N whose exec p99
stayed within 100 ms.

`--compare` runs each variant (QEMU/VMM settings and guest kernel command lines, `VARIANTS` below) in rounds,
interleaved, `--n` children each: before/after figures from one run, so load from other users of the host hits
all variants alike. Variants with another kernel command line fork from a parent of their own.

With `--pageout SECS` (or the `pageout` variant), children idle that long have their VMM's anonymous memory paged
out to the host's swap, as the daemon does with FORKD_IDLE_PAGEOUT_SECS (forkd.core.idle); it needs swap, zram for
these figures. Pss then leaves out what went to swap, so the judged figure is Pss + zram (the children's Pss plus
what zram grew by since they started: their pages, compressed, in RAM), beside the MemAvailable drop, which counts
zram too.

What the figures leave out: the host kernel's own per-process memory (page tables of the QEMU processes are in
MemAvailable but not in Pss), and idle CPU of host threads that are not QEMU's (none for forkd children). The run
stops adding children when MemAvailable falls under `--reserve-gib`, or when it has used `--max-gib`.
Progress goes to stderr; the table (or JSON with -o json) to stdout; `--report` writes the JSON to a file too.
Every child started here is stopped; the snapshots are kept for the next run.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.base.errors import ForkdError, NotFound  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core.idle import CLK_TCK, cpu_ticks  # noqa: E402
from forkd.core.requests import ParentBuild, Spawn  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.vmm.pageout import meminfo_kib  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib.cli import run_main  # noqa: E402
from lib.density_probes import (  # noqa: E402
    host_busy_ms,
    idle_cpu_pct,
    mem_available_kib,
    memory_now,
    zram_used_kib,
)
from lib.host_knobs import HostMthp, KsmScanner  # noqa: E402
from lib.sweeper import Sweeper, page_out_idle  # noqa: E402

TAG = "bench-density"
WARM_IMPORTS = ("json", "decimal")
EXEC_LIMIT_MS = 100.0
TARGET_MEM_MIB = 12.0
TARGET_CPU_PCT = 0.1
TARGET_N = 1500

OLD_CMDLINE = "console=ttyS0 quiet panic=-1"  # the guest kernel command line before issue 18
# name -> FORKD_* environment for the VMMs and the parents (each distinct FORKD_GUEST_CMDLINE gets a parent of its own)
VARIANTS: dict[str, dict[str, str]] = {
    "before": {"FORKD_TCG_TB_MIB": "32", "FORKD_VMM_MALLOC_ARENA_MAX": "0", "FORKD_GUEST_CMDLINE": OLD_CMDLINE},
    "tb-4": {"FORKD_TCG_TB_MIB": "4", "FORKD_VMM_MALLOC_ARENA_MAX": "0", "FORKD_GUEST_CMDLINE": OLD_CMDLINE},
    "tb-8": {"FORKD_TCG_TB_MIB": "8", "FORKD_VMM_MALLOC_ARENA_MAX": "0", "FORKD_GUEST_CMDLINE": OLD_CMDLINE},
    "tb-16": {"FORKD_TCG_TB_MIB": "16", "FORKD_VMM_MALLOC_ARENA_MAX": "0", "FORKD_GUEST_CMDLINE": OLD_CMDLINE},
    "arena-1": {"FORKD_TCG_TB_MIB": "32", "FORKD_VMM_MALLOC_ARENA_MAX": "1", "FORKD_GUEST_CMDLINE": OLD_CMDLINE},
    "quiet-guest": {"FORKD_TCG_TB_MIB": "32", "FORKD_VMM_MALLOC_ARENA_MAX": "0"},  # this tree's command line
    "after": {},  # this tree's defaults, but no page-out (the bench runs no sweeper unless a variant asks)
    "ksm": {"FORKD_VMM_KSM": "1"},  # opt-in page merging (off by default: SECURITY.md section 9); see KsmScanner
    "pageout": {"FORKD_IDLE_PAGEOUT_SECS": "3"},  # idle children's VMM memory to swap (zram), after 3 s; page_out_idle
    "pageout-anon": {"FORKD_IDLE_PAGEOUT_SECS": "3", "scope": "anon"},  # the same, anonymous mappings only
    "primed": {"prime": "true"},  # each child runs `true` once at fork (Spawn.prime): its first exec is translated
    "pageout-primed": {"FORKD_IDLE_PAGEOUT_SECS": "3", "prime": "true"},  # both
    # paged-out children are also stopped until their next request (FORKD_IDLE_SLEEP, forkd.sandbox.child)
    "pageout-primed-sleep": {"FORKD_IDLE_PAGEOUT_SECS": "3", "prime": "true", "FORKD_IDLE_SLEEP": "1"},
    # the same on a host whose anonymous 64 KiB mTHP is on for MADV_HUGEPAGE mappings (TCG's code buffer is one): a
    # page-in swaps it back 64 KiB at a time instead of 4 KiB (host-wide sysfs, put back after; HostMthp)
    "pageout-primed-sleep-mthp64": {"FORKD_IDLE_PAGEOUT_SECS": "3", "prime": "true", "FORKD_IDLE_SLEEP": "1",
                                    "mthp_kib": "64"},
    # a request's page-in reads every swapped page back, not TCG's code only (FORKD_PAGE_IN_SCOPE)
    "pageout-primed-wakeall": {"FORKD_IDLE_PAGEOUT_SECS": "3", "prime": "true", "FORKD_PAGE_IN_SCOPE": "all"},
    # before the page-in on request (forkd.sandbox.child): a request faults the child's pages back one by one
    "pageout-nowake": {"FORKD_IDLE_PAGEOUT_SECS": "3", "FORKD_PAGE_IN_ON_REQUEST": "0"},
    "pageout-primed-nowake": {"FORKD_IDLE_PAGEOUT_SECS": "3", "prime": "true", "FORKD_PAGE_IN_ON_REQUEST": "0"},
}


def parent_tag() -> str:
    """The snapshot for the guest kernel command line in effect: one parent per distinct command line."""
    return f"{TAG}-{hashlib.sha256(settings().guest_cmdline.encode()).hexdigest()[:8]}"


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return statistics.median(s) if p == 50 else s[max(0, math.ceil(p / 100.0 * len(s)) - 1)]


# -- host measurements ------------------------------------------------------------------------------
def exec_latencies(rt: Runtime, ids: list[str], n: int, split: dict | None = None) -> list[float]:
    """`n` sequential `exec true` on random children, in ms. With `split`, adds where their CPU went: `vmm_ms`, the
    exec'd child's VMM from just before to just after its exec (clock ticks: 10 ms steps, summed), and `forkd_ms`,
    this process's (the request, the page-in thread, the sweeper thread)."""
    out = []
    for cid in random.sample(ids, min(n, len(ids))) if n <= len(ids) else random.choices(ids, k=n):
        pid = rt.registry.get(cid).pid if split is not None else None
        v0, c0, t0 = vmm_ticks(pid), time.process_time(), time.perf_counter()
        res = rt.exec(cid, ["true"])
        out.append((time.perf_counter() - t0) * 1000.0)
        if split is not None:
            split["forkd_ms"] = split.get("forkd_ms", 0.0) + (time.process_time() - c0) * 1000.0
            split["vmm_ms"] = split.get("vmm_ms", 0.0) + (vmm_ticks(pid) - v0) * 1000.0 / CLK_TCK
        if res["exit_code"] != 0:
            raise ForkdError(f"child {cid}: exec true exited {res['exit_code']}")
    return out


def vmm_ticks(pid: int | None) -> int:
    """utime + stime of the VMM `pid` so far (0 without one, or once it is gone)."""
    return (cpu_ticks(pid) or 0) if pid else 0


# -- the snapshot -----------------------------------------------------------------------------------
def ensure_snapshot(rt: Runtime, tag: str, memory_mib: int) -> bool:
    """A ready `tag` of this image, memory and warm-up (created if missing or different); True when reused."""
    image, _ = rt.build_image(progress)
    try:
        snap = rt.store.get_ready(tag)
        if snap.memory_mib == memory_mib and snap.image_id == image.id and tuple(snap.warm_imports) == WARM_IMPORTS:
            return True
        rt.kill(tag=tag)
        rt.rmi(tag)
    except NotFound:
        pass
    except ForkdError:
        rt.kill(tag=tag)
        rt.rmi(tag, force=True)
    progress(f"creating snapshot {tag!r} ({memory_mib} MiB; guest command line {settings().guest_cmdline!r})")
    rt.create_snapshot(ParentBuild.of(tag=tag, memory_mib=memory_mib, warm_imports=WARM_IMPORTS), progress=progress)
    return False


# -- one level of N ---------------------------------------------------------------------------------
BATCH_SWAP_KIB = 24 * 1024  # what one child pages out, with room (measured: ~19 MiB)
BATCH_SWAP_PRIMED_KIB = 44 * 1024  # the same for a primed child (measured: ~38 MiB)


def sample(rt: Runtime, recs: list, avail0: int, window: float, execs: int, helpers: tuple[int, ...] = (),
           zram0: int = 0, sweeper: Sweeper | None = None) -> dict:
    """One level's figures; `helpers`: host processes working for the children (ksmd) whose CPU counts too;
    `zram0`: zram's use before the children (what it grew by since holds their paged-out pages, compressed).
    Memory is read twice: idle (after the CPU window, before any exec: the top-level figures) and `after_execs`
    (each exec wakes a child: its first one translates ~9 MiB more code and pages back what it touches)."""
    pids = [r.pid for r in recs]
    time.sleep(min(2.0, window))  # let the last forks settle
    cpu = idle_cpu_pct(pids + list(helpers), window)
    idle = memory_now(recs, avail0, zram0)
    busy0, t0, sw0 = host_busy_ms(), time.monotonic(), sweeper.counters() if sweeper else None
    cpu_split: dict[str, float] = {}
    lat = exec_latencies(rt, [r.id for r in recs], execs, cpu_split)
    busy, wall = host_busy_ms() - busy0, (time.monotonic() - t0) * 1000.0
    sw = [b - a for a, b in zip(sw0, sweeper.counters(), strict=True)] if sweeper and sw0 else None
    n = len(recs)
    split = [rt.memory(r.id) for r in random.sample(recs, min(10, n))]  # smaps of a few: what a child adds
    return {"n": n, **idle, "after_execs": memory_now(recs, avail0, zram0),
            "guest_private_mib_p50": round(pct([m["guest_private_kib"] / 1024.0 for m in split], 50), 2),
            "vmm_pss_mib_p50": round(pct([m["vmm_pss_kib"] / 1024.0 for m in split], 50), 2),
            "idle_cpu_pct_per_child": round(cpu / n, 4), "idle_cpu_pct_total": round(cpu, 2),
            "exec_ms": {"n": len(lat), "p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99),
                        "max": max(lat), "samples": [round(x, 2) for x in lat]},
            # the host's busy CPU while the execs ran, per exec, less the children's idle CPU over that time: what
            # one request costs the host (VMM, page-in, agent, this process); the host's other work counts too
            "host_cpu_ms_per_exec": round((busy - cpu / 100.0 * wall) / max(1, len(lat)), 1),
            # of which the exec'd child's VMM and this process (forkd's request, page-in and sweeper threads); the
            # rest is the host's kernel threads (kswapd, zram) and every other process
            "cpu_split_ms_per_exec": {k: round(v / max(1, len(lat)), 1) for k, v in cpu_split.items()},
            # of which the idle sweeper's thread (its look at every child each second, and the page-outs of children
            # the execs woke once they were idle again): None without one
            "sweeper_during_execs": {"cpu_ms_per_exec": round(sw[0] / max(1, len(lat)), 1), "ticks": sw[1],
                                     "page_outs": sw[2]} if sw else None}


def limits(points: list[dict], avail0_mib: float, nproc: int) -> dict:
    """Where this host runs out, projected from the last point: memory by the children's own Pss plus their pages
    in zram (MemAvailable
    also moves with everything else on the host; its projection is given beside it), CPU by their idle CPU
    (None when below the 10 ms tick resolution of the window)."""
    last = points[-1]
    ok = [p["n"] for p in points if p["exec_ms"]["p99"] <= EXEC_LIMIT_MS]
    cpu = last["idle_cpu_pct_per_child"]
    return {"n_memory_runs_out": int(avail0_mib / max(last["own_per_child_mib"], 1e-6)),
            "n_memory_runs_out_by_mem_available": int(avail0_mib / last["mem_per_child_mib"])
            if last["mem_per_child_mib"] > 0 else None,
            "n_cpu_runs_out": int(nproc * 100.0 / cpu) if cpu > 0 else None,
            "largest_n_exec_p99_within_100ms": max(ok, default=0), "measured_up_to_n": last["n"]}


def fill(rt: Runtime, args: argparse.Namespace, tag: str, made: set[str], on_level=None,
         prime: tuple[str, ...] = ()) -> list:
    """Fork `args.n` children of `tag` in batches (each running `prime` once: Spawn.prime), calling on_level(recs)
    after each; stops early at the limits."""
    recs: list = []
    avail0 = mem_available_kib()
    while len(recs) < args.n:
        k = min(args.batch, args.n - len(recs))
        got = rt.fork(Spawn.of(tag=tag, n=k, timeout=120.0, prime=prime))
        made.update(r.id for r in got)
        recs += got
        if on_level:
            on_level(recs)
        avail = mem_available_kib()
        used_gib = (avail0 - avail) / 2**20
        if avail / 2**20 < args.reserve_gib or used_gib > args.max_gib:
            progress(f"stopping at {len(recs)} children: MemAvailable {avail / 2**20:.1f} GiB, used {used_gib:.1f} "
                     f"GiB (--reserve-gib {args.reserve_gib}, --max-gib {args.max_gib})")
            break
        swap_free = meminfo_kib("SwapFree")
        per_child = BATCH_SWAP_PRIMED_KIB if prime else BATCH_SWAP_KIB
        if args.pageout and swap_free < args.batch * per_child:  # a full swap pages out nothing more
            progress(f"stopping at {len(recs)} children: swap has {swap_free / 2**20:.1f} GiB free, under what "
                     f"{args.batch} more would page out (make the zram device larger)")
            break
    return recs


def run_levels(rt: Runtime, args: argparse.Namespace, made: set[str]) -> dict:
    tag = parent_tag()
    reused = ensure_snapshot(rt, tag, args.memory_mib)
    avail0, zram0 = mem_available_kib(), zram_used_kib()
    nproc = len(os.sched_getaffinity(0))
    points: list[dict] = []
    t0 = time.perf_counter()
    timeline: list[tuple[float, int]] = []
    sweeper = Sweeper(rt, args.pageout) if args.pageout else None  # one for the run, as the daemon keeps one

    def level(recs: list) -> None:
        timeline.append((time.perf_counter() - t0, len(recs)))
        paged = sweeper.wait_paged(recs) if sweeper else None
        p = sample(rt, recs, avail0, args.sample_s, args.sample_execs, zram0=zram0, sweeper=sweeper)
        p["pageout"] = paged
        points.append(p)
        progress(f"N={p['n']}: {p['mem_per_child_mib']:.1f} MiB/child (MemAvailable), {p['pss_per_child_mib']:.1f} "
                 f"MiB/child (Pss), idle CPU {p['idle_cpu_pct_per_child']:.3f} %/child, exec p50 "
                 f"{p['exec_ms']['p50']:.1f} p99 {p['exec_ms']['p99']:.1f} ms, host CPU/exec "
                 f"{p['host_cpu_ms_per_exec']} ms ({p['cpu_split_ms_per_exec']}, sweeper "
                 f"{(p['sweeper_during_execs'] or {}).get('cpu_ms_per_exec')})")

    with sweeper or nullcontext():
        recs = fill(rt, args, tag, made, level, prime=tuple(args.prime))
        progress(f"all {len(recs)} idle: {args.idle_s:.0f} s CPU window, {args.execs} execs")
        paged = sweeper.wait_paged(recs) if sweeper else None
        final = sample(rt, recs, avail0, args.idle_s, args.execs, zram0=zram0, sweeper=sweeper)
    final["pageout"] = paged
    return {"snapshot": {"tag": tag, "reused": reused, "memory_mib": args.memory_mib},
            "mem_available_at_start_mib": round(avail0 / 1024.0), "levels": points, "final": final,
            "fork_timeline_s": timeline, "limits": limits([*points[:-1], final], avail0 / 1024.0, nproc)}


# -- --compare: variants side by side --------------------------------------------------------------
def with_env(variant: dict[str, str]):
    env = {k: v for k, v in variant.items() if k.startswith("FORKD_")}  # other keys are the bench's own
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return restore


def compare(rt: Runtime, args: argparse.Namespace, made: set[str]) -> dict:
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            raise ForkdError(f"unknown variant {name!r}", hint=f"one of {', '.join(VARIANTS)}")
    tags = {}
    for name in names:
        restore = with_env(VARIANTS[name])
        try:
            tags[name] = parent_tag()
            ensure_snapshot(rt, tags[name], args.memory_mib)
        finally:
            restore()
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else reversed(names):
            restore = with_env(VARIANTS[name])
            try:
                mthp = VARIANTS[name].get("mthp_kib")
                with (KsmScanner() if VARIANTS[name].get("FORKD_VMM_KSM") == "1" else nullcontext()) as scan, \
                        HostMthp(mthp) if mthp else nullcontext():
                    avail0, zram0 = mem_available_kib(), zram_used_kib()
                    recs = fill(rt, args, tags[name], made, prime=tuple(filter(None, [VARIANTS[name].get("prime")])))
                    merged = scan.settle() if scan else None
                    pageout = VARIANTS[name].get("FORKD_IDLE_PAGEOUT_SECS")
                    scope = VARIANTS[name].get("scope", "private")
                    paged = page_out_idle(rt, recs, float(pageout), scope=scope) if pageout else None
                    p = sample(rt, recs, avail0, args.idle_s, args.execs, tuple(scan.pids) if scan else (), zram0)
                    p["ksm"], p["pageout"] = merged, paged
                p["fork_ready_ms_p50"] = pct([r.timings_ms.get("ready", 0.0) for r in recs], 50)
                rows[name].append(p)
                progress(f"round {rnd + 1} {name}: {p['pss_per_child_mib']:.1f} MiB/child Pss, "
                         f"{p['mem_per_child_mib']:.1f} MemAvailable, idle {p['idle_cpu_pct_per_child']:.3f} %/child, "
                         f"exec p50 {p['exec_ms']['p50']:.1f} ms, ready p50 {p['fork_ready_ms_p50']:.0f} ms")
                ids = [r.id for r in recs]
                rt.kill(ids)
                made.difference_update(ids)
            finally:
                restore()
    out = {}
    for name, ps in rows.items():
        out[name] = {k: statistics.median([p[k] for p in ps]) for k in
                     ("pss_per_child_mib", "mem_per_child_mib", "idle_cpu_pct_per_child", "fork_ready_ms_p50",
                      "guest_private_mib_p50", "vmm_pss_mib_p50", "swap_per_child_mib", "own_per_child_mib")}
        out[name]["exec_p50_ms"] = statistics.median([p["exec_ms"]["p50"] for p in ps])
        out[name]["exec_p90_ms"] = statistics.median([p["exec_ms"]["p90"] for p in ps])
        out[name]["host_cpu_ms_per_exec"] = statistics.median([p["host_cpu_ms_per_exec"] for p in ps])
        out[name]["cpu_split_ms_per_exec"] = {k: statistics.median([p["cpu_split_ms_per_exec"].get(k, 0.0) for p in ps])
                                              for k in ps[0]["cpu_split_ms_per_exec"]}
        out[name]["own_after_execs_mib"] = statistics.median([p["after_execs"]["own_per_child_mib"] for p in ps])
        out[name]["rounds"] = ps
        out[name]["env"] = VARIANTS[name]
    return {"variants": out, "n_per_variant": args.n, "rounds": args.rounds}


# -- output -----------------------------------------------------------------------------------------
def table(r: dict) -> str:
    m = r["machine"]
    lines = [f"forkd density benchmark (accel {m['accel']}, {m['nproc']} cores, {m['guest_memory_mib']} MiB guests, "
             f"load {m['loadavg_at_start'][0]:.2f}->{m['loadavg_at_end'][0]:.2f})"]
    if "variants" in r:
        lines.append(f"  {r['n_per_variant']} children per variant, {r['rounds']} rounds interleaved, medians:")
        lines.append(f"  {'variant':<14}{'Pss MiB/child':>14}{'MemAvail MiB/child':>20}{'Pss+zram MiB/child':>19}"
                     f"{'after execs':>12}{'idle %core/child':>18}{'exec p50 ms':>13}{'exec p90 ms':>13}"
                     f"{'ready p50 ms':>14}{'CPU ms/exec':>13}")
        for name, v in r["variants"].items():
            lines.append(f"  {name:<14}{v['pss_per_child_mib']:>14.2f}{v['mem_per_child_mib']:>20.2f}"
                         f"{v['own_per_child_mib']:>19.2f}{v['own_after_execs_mib']:>12.2f}"
                         f"{v['idle_cpu_pct_per_child']:>18.4f}"
                         f"{v['exec_p50_ms']:>13.1f}{v['exec_p90_ms']:>13.1f}{v['fork_ready_ms_p50']:>14.0f}"
                         f"{v['host_cpu_ms_per_exec']:>13.1f}")
        return "\n".join(lines)
    lines.append(f"  {'N':>6}{'MemAvail MiB/child':>20}{'Pss MiB/child':>15}{'Pss+zram MiB/child':>19}"
                 f"{'idle %core/child':>18}{'exec p50':>10}{'exec p99':>10}{'CPU ms/exec':>13}")
    for p in [*r["levels"], r["final"]]:
        e = p["exec_ms"]
        lines.append(f"  {p['n']:>6}{p['mem_per_child_mib']:>20.2f}{p['pss_per_child_mib']:>15.2f}"
                     f"{p['own_per_child_mib']:>19.2f}{p['idle_cpu_pct_per_child']:>18.4f}{e['p50']:>10.1f}"
                     f"{e['p99']:>10.1f}{p['host_cpu_ms_per_exec']:>13.1f}")
    f, lim = r["final"], r["limits"]
    mem = f["own_per_child_mib"]
    lines += ["",
              f"  at N={f['n']} over {r['idle_s']:.0f} s: {mem:.2f} MiB/child by Pss + zram "
              f"(target <= {TARGET_MEM_MIB:.0f}: "
              f"{'PASS' if mem <= TARGET_MEM_MIB else 'MISS'}), idle CPU {f['idle_cpu_pct_per_child']:.3f} % of a "
              f"core/child (target <= {TARGET_CPU_PCT}: "
              f"{'PASS' if f['idle_cpu_pct_per_child'] <= TARGET_CPU_PCT else 'MISS'})",
              f"  runs out at: memory N={lim['n_memory_runs_out']} (by MemAvailable "
              f"{lim['n_memory_runs_out_by_mem_available']}), idle CPU N={lim['n_cpu_runs_out']}; exec p99 "
              f"within {EXEC_LIMIT_MS:.0f} ms up to N={lim['largest_n_exec_p99_within_100ms']} (measured up to "
              f"{lim['measured_up_to_n']}; target {TARGET_N})"]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (see the module doc)",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--home", default=str(settings().home), help="FORKD_HOME (default $FORKD_HOME)")
    ap.add_argument("--n", type=int, default=300, help="children in all (default 300; the issue's figure: 1500)")
    ap.add_argument("--batch", type=int, default=100, help="children forked per batch (default 100)")
    ap.add_argument("--memory-mib", type=int, default=512, help="guest memory (default 512)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="idle CPU window at full N (default 30)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="idle CPU window after each batch (default 5)")
    ap.add_argument("--execs", type=int, default=100, help="execs on random children at full N (default 100)")
    ap.add_argument("--sample-execs", type=int, default=20, help="execs after each batch (default 20)")
    ap.add_argument("--reserve-gib", type=float, default=4.0, help="stop adding children under this MemAvailable "
                    "(keep it above what one batch costs before it is paged out: ~3 GiB for 100)")
    ap.add_argument("--max-gib", type=float, default=12.0, help="stop adding children once they use this much")
    ap.add_argument("--pageout", type=float, default=0.0, metavar="SECS",
                    help="page out children idle SECS (as the daemon does with FORKD_IDLE_PAGEOUT_SECS) after each "
                         "batch and before the final window; needs swap (zram)")
    ap.add_argument("--sleep", action="store_true", help="with --pageout: paged-out children are also stopped "
                    "until their next request (FORKD_IDLE_SLEEP=1; forkd.sandbox.child)")
    ap.add_argument("--prime", action="append", default=[], metavar="CMD",
                    help="each child runs CMD once when forked (Spawn.prime; e.g. true: its first exec is then "
                         "translated at fork time); repeat for more")
    ap.add_argument("--compare", action="store_true", help="variants side by side instead of one climb")
    ap.add_argument("--variants", default="before,after", help=f"with --compare: any of {', '.join(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2, help="with --compare: interleaved rounds (default 2)")
    ap.add_argument("--short", action="store_true", help="CI mode: 4 children, batches of 2, 2 s windows")
    ap.add_argument("--report", help="also write the JSON report to this file")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    if args.short:
        args.n, args.batch, args.idle_s, args.sample_s, args.execs, args.sample_execs = 4, 2, 2.0, 1.0, 5, 3
        args.memory_mib, args.rounds = min(args.memory_mib, 256), 1
    if min(args.n, args.batch, args.execs, args.sample_execs, args.rounds) < 1:
        ap.error("--n, --batch, --execs, --sample-execs and --rounds must be >= 1")
    if args.sleep and not args.pageout:
        ap.error("--sleep needs --pageout SECS (children sleep when the sweeper pages them out)")
    # this bench names what it primes (Spawn.prime, --prime, a variant's "prime") and when children sleep (--sleep,
    # a variant's FORKD_IDLE_SLEEP): the defaults' own prime and sleep stay off unless asked for, so a variant means
    # what its name says (bench/wake.py --defaults measures the defaults as shipped)
    os.environ["FORKD_PRIME"] = "0"
    os.environ["FORKD_IDLE_SLEEP"] = "1" if args.sleep else "0"  # read by forkd.core.idle in this process's sweeper
    return args


def run(args: argparse.Namespace) -> dict:
    rt = Runtime(Layout(Path(args.home).absolute()))
    image, _ = rt.build_image(progress)
    decision, _ = rt.accelerator(image, progress)
    made: set[str] = set()
    result: dict = {"machine": {"accel": decision.accel, "nproc": len(os.sched_getaffinity(0)),
                                "guest_memory_mib": args.memory_mib, "qemu_version": rt.driver.version(),
                                "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
                    "idle_s": args.idle_s, "prime": args.prime, "pageout_secs": args.pageout, "sleep": args.sleep,
                    "targets": {"mem_mib": TARGET_MEM_MIB, "idle_cpu_pct": TARGET_CPU_PCT, "n": TARGET_N,
                                "exec_ms": EXEC_LIMIT_MS}}
    try:
        result.update(compare(rt, args, made) if args.compare else run_levels(rt, args, made))
    finally:
        if made:
            progress(f"stopping {len(made)} children")
            for cid in sorted(made):
                try:
                    rt.kill([cid])
                except ForkdError:
                    pass
    result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def main(argv: list[str] | None = None) -> int:
    return run_main(parse(argv), run, table)


if __name__ == "__main__":
    sys.exit(main())
