#!/usr/bin/env python3
"""Fork benchmark: cold boot vs. fork, fan-out rate and memory per idle child, in one run.

    python3 bench/fork.py [--home DIR] [--cold 5] [--forks 20] [--fanout 32] [--memory-mib 512] [-o json]

Measures, against a real QEMU on this machine:
  1. cold boot + warm-up imports until a first `eval` answers (a fresh parent VM each run);
  2. fork (restore of a warm snapshot) until an `eval` using a warm module answers over a fresh connection,
     with the median of each restore step from the child's record;
  3. the ratio of the two medians;
  4. fan-out of N children: until `rt.fork` returns (all answered `forked`) and until all answered an eval;
  5. private guest RAM and QEMU overhead per idle child (from /proc/PID/smaps).
Progress goes to stderr; the table (or JSON with -o json) to stdout. Every QEMU started here is stopped.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import secrets
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lib.cli import run_main

from forkd.base.errors import ForkdError, NotFound
from forkd.base.paths import Layout, tmpfs
from forkd.base.settings import settings
from forkd.core.requests import ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.vmm.driver import Machine, RunFiles

TAG = "bench-fork"
WARM_IMPORTS = ("json", "decimal", "hashlib", "sqlite3")  # as specs/examples/pool.yaml
WARM_CODE = "import " + ", ".join(WARM_IMPORTS)  # "import json, decimal, hashlib, sqlite3"
FORK_EXPR = "decimal.Decimal(1)"
FORK_EXPECT = "Decimal('1')"
STEPS = ("start_vmm", "connect", "load_state", "resume", "restore", "forked", "ready")
BOOT_STEPS = ("start_vmm", "connect", "agent_ready")

TARGET_RATIO = 50.0  # cold p50 / fork p50 >= 50x
TARGET_RATE = 25.0  # children/s >= 25
TARGET_PRIVATE_MIB = 4.0  # private guest RAM per idle child <= 4 MiB


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- statistics -------------------------------------------------------------------------------------
def nearest_rank(xs: list[float], p: float) -> float:
    """The p-th percentile (0 < p <= 100) by the nearest-rank method: always one of the samples."""
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100.0 * len(s)) - 1)]


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50": statistics.median(xs), "p90": nearest_rank(xs, 90), "min": min(xs),
            "max": max(xs), "samples": [round(x, 3) for x in xs]}


def cpu_ms(pid: int) -> float:
    """utime + stime of process `pid` (all its threads) so far, in ms (10 ms resolution at 100 Hz)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def self_cpu_ms() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return (ru.ru_utime + ru.ru_stime) * 1000.0


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# -- the snapshot -----------------------------------------------------------------------------------
def ensure_snapshot(rt: Runtime, image_id: str, memory_mib: int) -> tuple[dict, bool]:
    """Reuse a ready `bench-fork` snapshot made with the same warm imports, memory and image; else (re)create."""
    try:
        snap = rt.store.get_ready(TAG)
        if (tuple(snap.warm_imports) == WARM_IMPORTS and snap.memory_mib == memory_mib
                and snap.image_id == image_id and not snap.warm_run and not snap.warm_exec):
            return snap.to_json(), True
        progress(f"snapshot {TAG!r} differs (imports/memory/image): recreating it")
        rt.kill(tag=TAG)
        rt.rmi(TAG)
    except NotFound:
        pass
    except ForkdError as exc:  # writing, failed or torn: start over
        progress(f"snapshot {TAG!r} not usable ({str(exc).splitlines()[0]}): recreating it")
        rt.kill(tag=TAG)
        rt.rmi(TAG, force=True)
    progress(f"creating snapshot {TAG!r} ({memory_mib} MiB, warm imports: {', '.join(WARM_IMPORTS)})")
    snap = rt.create_snapshot(ParentBuild.of(tag=TAG, memory_mib=memory_mib, warm_imports=WARM_IMPORTS),
                              progress=progress)
    return snap.to_json(), False


# -- 1. cold boot -----------------------------------------------------------------------------------
def cold_boot_once(rt: Runtime, machine: Machine, i: int) -> tuple[float, dict]:
    tag = f"bench-cold-{os.getpid()}-{i}-{secrets.token_hex(2)}"
    work = rt.layout.tmp / tag
    mem = (tmpfs() or work) / f"forkd-{tag}.mem"
    vm = None
    try:
        work.mkdir(parents=True)
        t0 = time.perf_counter()
        vm = rt.driver.boot(machine, mem, RunFiles(work))
        t_boot = time.perf_counter()
        res = vm.agent.exec_code(WARM_CODE)
        if res["error"]:
            raise ForkdError(f"cold boot: warm imports failed: {res['error']['type']}: {res['error']['message']}")
        t_warm = time.perf_counter()
        res = vm.agent.eval("1+1")
        t1 = time.perf_counter()
        if res["error"] or res["value"] != "2":
            raise ForkdError(f"cold boot: eval('1+1') answered {res!r}")
        parts = {k: vm.timings_ms.get(k) for k in BOOT_STEPS}
        parts.update(boot=(t_boot - t0) * 1000.0, warm_imports=(t_warm - t_boot) * 1000.0,
                     first_eval=(t1 - t_warm) * 1000.0)
        return (t1 - t0) * 1000.0, parts
    finally:
        if vm is not None:
            rt.driver.stop(vm)
        mem.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


# -- the whole run ----------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict:
    rt = Runtime(Layout(Path(args.home).absolute()))
    progress(f"FORKD_HOME={rt.layout.home}")
    image, built = rt.build_image(progress)  # (image, True) when it had to be built now
    progress(f"image {image.id} ({'built now' if built else 'cached'})")
    decision, _ = rt.accelerator(image, progress)
    machine = Machine(kernel=image.kernel, initrd=image.initrd, memory_mib=args.memory_mib, accel=decision.accel)
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count() or 0
    result: dict = {
        "machine": {"accelerator": decision.accel, "accelerator_reason": decision.reason, "nproc": nproc,
                    "qemu_version": rt.driver.version(), "guest_memory_mib": args.memory_mib, "vcpus": 1,
                    "host": platform.node(), "kernel": platform.release(),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()], "image_id": image.id},
        "targets": {"ratio_x": TARGET_RATIO, "children_per_s": TARGET_RATE, "private_mib": TARGET_PRIVATE_MIB},
    }

    # Children of the bench tag that exist before we start are not ours: never touch them.
    preexisting = {c.id for c in rt.children()}
    made: set[str] = set()

    def cleanup() -> None:
        ours = [c.id for c in rt.children() if c.id in made
                or (c.snapshot == TAG and c.id not in preexisting)]
        if ours:
            progress(f"stopping {len(ours)} leftover children")
            for cid in ours:
                try:
                    rt.kill([cid])
                except ForkdError:
                    pass
        made.clear()

    try:
        # 1. cold boots
        totals, parts = [], []
        for i in range(args.cold):
            ms, p = cold_boot_once(rt, machine, i)
            totals.append(ms)
            parts.append(p)
            progress(f"cold boot {i + 1}/{args.cold}: {ms:.0f} ms (boot {p['boot']:.0f}, "
                     f"warm imports {p['warm_imports']:.0f}, eval {p['first_eval']:.0f})")
        result["cold"] = summary(totals)
        result["cold"]["breakdown_p50_ms"] = {k: med([p[k] for p in parts if p.get(k) is not None])
                                              for k in (*BOOT_STEPS, "boot", "warm_imports", "first_eval")}

        # the snapshot (reused when it matches)
        snap, reused = ensure_snapshot(rt, image.id, args.memory_mib)
        result["snapshot"] = {"tag": TAG, "reused": reused, "memory_mib": snap["memory_mib"],
                              "warm_imports": snap["warm_imports"], "timings_ms": snap["timings_ms"],
                              "memory_stored_mib": round(snap["memory_stored_bytes"] / 2**20, 1)}
        progress(f"snapshot {TAG!r} {'reused' if reused else 'created'}")

        # 2. sequential forks until an eval over a fresh connection answered
        totals, steps, after_ready, cpu = [], [], [], []
        for i in range(args.forks):
            t0, c0 = time.perf_counter(), self_cpu_ms()
            (rec,) = rt.fork(Spawn.of(tag=TAG, n=1))
            made.add(rec.id)
            t_fork, c_fork, q_fork = time.perf_counter(), self_cpu_ms(), cpu_ms(rec.pid)
            with rt.agent(rec.id) as a:
                res = a.eval(FORK_EXPR)
            t1 = time.perf_counter()
            cpu.append({"vmm_until_forked": q_fork, "vmm_first_eval": cpu_ms(rec.pid) - q_fork,
                        "forkd_fork_call": c_fork - c0, "forkd_connect_eval": self_cpu_ms() - c_fork})
            rt.kill([rec.id])
            made.discard(rec.id)
            if res["error"] or res["value"] != FORK_EXPECT:
                raise ForkdError(f"fork: eval({FORK_EXPR!r}) answered {res!r}")
            ms = (t1 - t0) * 1000.0
            totals.append(ms)
            steps.append(rec.timings_ms)
            after_ready.append((t1 - t_fork) * 1000.0)
            progress(f"fork {i + 1}/{args.forks}: {ms:.0f} ms (ready {rec.timings_ms.get('ready', 0):.0f}, "
                     f"connect+eval {(t1 - t_fork) * 1000.0:.0f})")
        result["fork"] = summary(totals)
        bd = {k: med([s[k] for s in steps if k in s]) for k in STEPS}
        bd["fork_call_overhead"] = med([t - s.get("ready", 0) - a for t, s, a in zip(totals, steps, after_ready,
                                                                                       strict=True)])
        bd["connect_and_eval"] = med(after_ready)
        result["fork"]["breakdown_p50_ms"] = bd
        # CPU per child by phase (means: /proc ticks are 10 ms): the floor of fan-out on this many cores
        result["cpu_per_child_ms"] = {k: statistics.fmean(c[k] for c in cpu) for k in cpu[0]}
        total_cpu = sum(result["cpu_per_child_ms"].values())
        result["cpu_per_child_ms"]["total"] = total_cpu
        result["cpu_floor_children_per_s"] = nproc * 1000.0 / total_cpu if total_cpu else None

        # 3. ratio
        result["ratio_x"] = result["cold"]["p50"] / result["fork"]["p50"]

        # 4. fan-out
        n = args.fanout
        progress(f"fan-out: forking {n} children at once")
        t0 = time.perf_counter()
        recs = rt.fork(Spawn.of(tag=TAG, n=n))
        made.update(r.id for r in recs)
        t_forked = time.perf_counter()

        def eval_one(cid: str) -> float:
            with rt.agent(cid) as a:
                res = a.eval(FORK_EXPR)
            if res["error"] or res["value"] != FORK_EXPECT:
                raise ForkdError(f"fan-out: child {cid} eval answered {res!r}")
            return time.perf_counter()

        with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
            answered = list(pool.map(eval_one, [r.id for r in recs]))
        t_evals = time.perf_counter()
        forked_s, evals_s = t_forked - t0, t_evals - t0
        result["fanout"] = {
            "n": n, "all_forked_ms": forked_s * 1000.0, "all_eval_ms": evals_s * 1000.0,
            "children_per_s_forked": n / forked_s, "children_per_s_eval": n / evals_s,
            "ready_ms": summary([r.timings_ms.get("ready", 0.0) for r in recs]),
            "eval_done_after_request_ms": summary([(t - t0) * 1000.0 for t in answered]),
        }
        progress(f"fan-out: all {n} answered forked in {forked_s * 1000:.0f} ms, an eval in {evals_s * 1000:.0f} ms")

        # 5. memory per idle child
        for r in recs:
            with rt.agent(r.id) as a:
                res = a.exec(["true"])
            if res["exit_code"] != 0:
                raise ForkdError(f"child {r.id}: exec true exited {res['exit_code']}")
        time.sleep(1.0)
        mems = [rt.memory(r.id) for r in recs]
        private = [m["guest_private_kib"] / 1024.0 for m in mems]
        vmm = [m["vmm_pss_kib"] / 1024.0 for m in mems]
        rss = [m["guest_rss_kib"] / 1024.0 for m in mems if "guest_rss_kib" in m]
        result["memory"] = {"n": len(mems), "guest_private_mib": summary(private),
                            "guest_rss_mib": summary(rss) if rss else None, "vmm_pss_mib": summary(vmm)}
        progress(f"memory: private guest RAM median {med(private):.2f} MiB, max {max(private):.2f} MiB; "
                 f"QEMU overhead median {med(vmm):.1f} MiB")
        ids = [r.id for r in recs]
        rt.kill(ids)
        made.difference_update(ids)
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        cleanup()
    return result


# -- output -----------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def table(r: dict) -> str:
    m, c, f, fo, mem = r["machine"], r["cold"], r["fork"], r["fanout"], r["memory"]
    snap = r["snapshot"]
    lines = [
        "forkd fork benchmark",
        f"  machine: accel={m['accelerator']}  nproc={m['nproc']}  qemu={m['qemu_version']}  "
        f"guest={m['guest_memory_mib']} MiB x {m['vcpus']} vCPU  kernel={m['kernel']}  "
        f"load={m['loadavg_at_start'][0]:.2f}->{m.get('loadavg_at_end', ['?'])[0]}",
        f"  snapshot: {snap['tag']} ({'reused' if snap['reused'] else 'created this run'}), "
        f"warm imports: {', '.join(snap['warm_imports'])}",
        "",
        f"  {'metric':<44}{'p50':>10}{'p90':>10}{'min':>10}{'max':>10}   target",
    ]

    def row(name: str, s: dict, unit: str = "ms", target: str = "", fmt: str = ".0f") -> None:
        vals = "".join(f"{format(s[k], fmt):>10}" for k in ("p50", "p90", "min", "max"))
        lines.append(f"  {name + f' ({unit})':<44}{vals}   {target}")

    def single(name: str, value: float, unit: str, target: str = "", fmt: str = ".0f") -> None:
        lines.append(f"  {name + f' ({unit})':<44}{format(value, fmt):>10}{'':>30}   {target}")

    row(f"1. cold boot + warm-up -> eval, n={c['n']}", c)
    cb = c["breakdown_p50_ms"]
    lines.append(f"       p50 parts: boot {cb['boot']:.0f} (start_vmm {cb['start_vmm']:.0f}, connect "
                 f"{cb['connect']:.0f}, agent_ready {cb['agent_ready']:.0f}), warm imports "
                 f"{cb['warm_imports']:.0f}, eval {cb['first_eval']:.1f}")
    row(f"2. fork -> eval over new conn, n={f['n']}", f, fmt=".1f")
    bd = f["breakdown_p50_ms"]
    lines.append("       p50 steps: " + ", ".join(f"{k} {bd[k]:.1f}" for k in STEPS if bd.get(k) is not None))
    lines.append(f"       p50 after ready: fork() overhead {bd['fork_call_overhead']:.1f}, "
                 f"connect+eval {bd['connect_and_eval']:.1f}")
    cp = r["cpu_per_child_ms"]
    lines.append(f"       CPU per child (mean ms): QEMU until forked {cp['vmm_until_forked']:.0f}, QEMU first eval "
                 f"{cp['vmm_first_eval']:.0f}, forkd fork() {cp['forkd_fork_call']:.0f}, forkd connect+eval "
                 f"{cp['forkd_connect_eval']:.0f} = {cp['total']:.0f} -> at most "
                 f"{r['cpu_floor_children_per_s']:.1f} children/s on {m['nproc']} cores")
    lines.append("")
    ratio = r["ratio_x"]
    lines.append(f"  >>> 3. RATIO cold p50 / fork p50 = {ratio:.1f}x   (target >= {TARGET_RATIO:.0f}x: "
                 f"{verdict(ratio >= TARGET_RATIO)}) <<<")
    lines.append("")
    n = fo["n"]
    single(f"4. fan-out {n}: all answered forked", fo["all_forked_ms"], "ms")
    single("   children/s (forked)", fo["children_per_s_forked"], "1/s",
           f">= {TARGET_RATE:.0f}/s {verdict(fo['children_per_s_forked'] >= TARGET_RATE)}", ".1f")
    single(f"   fan-out {n}: all answered an eval", fo["all_eval_ms"], "ms")
    single("   children/s (eval)", fo["children_per_s_eval"], "1/s",
           f">= {TARGET_RATE:.0f}/s {verdict(fo['children_per_s_eval'] >= TARGET_RATE)}", ".1f")
    row("   per-child ready (restore+forked)", fo["ready_ms"])
    gp = mem["guest_private_mib"]
    row(f"5. private guest RAM per idle child, n={mem['n']}", gp, "MiB",
        f"p50 <= {TARGET_PRIVATE_MIB:.0f} MiB {verdict(gp['p50'] <= TARGET_PRIVATE_MIB)}", ".2f")
    if mem.get("guest_rss_mib"):
        row("   guest RAM mapped (Rss of memory file)", mem["guest_rss_mib"], "MiB", fmt=".1f")
    row("   QEMU overhead per child (Pss)", mem["vmm_pss_mib"], "MiB", fmt=".1f")
    lines.append("")
    lines.append(f"  max private guest RAM {gp['max']:.2f} MiB ({verdict(gp['max'] <= TARGET_PRIVATE_MIB)} "
                 f"vs {TARGET_PRIVATE_MIB:.0f} MiB); p50 = median, p90 = nearest rank")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="forkd fork benchmark: cold boot vs fork, fan-out, memory per child")
    ap.add_argument("--home", default=str(settings().home),
                    help="FORKD_HOME to use (default: $FORKD_HOME or %(default)s)")
    ap.add_argument("--cold", type=int, default=5, help="cold boots to time (default 5)")
    ap.add_argument("--forks", type=int, default=20, help="sequential forks to time (default 20)")
    ap.add_argument("--fanout", type=int, default=32, help="children to fork at once (default 32)")
    ap.add_argument("--memory-mib", type=int, default=512, help="guest memory (default 512)")
    ap.add_argument("--report", help="also write the JSON report to this file")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    for name in ("cold", "forks", "fanout"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")

    return run_main(args, run, table)  # SIGTERM/SIGHUP unwind, so the finally blocks stop every QEMU we started


if __name__ == "__main__":
    sys.exit(main())
