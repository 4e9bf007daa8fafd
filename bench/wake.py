#!/usr/bin/env python3
"""What waking an idle child costs the host, and what a host near its memory limit adds.

    python3 bench/wake.py [--home DIR] [--n 300] [--execs 100] [--rounds 2] [--leave-gib 2] [--report FILE]
    python3 bench/wake.py --short          # CI: 6 children, 6 execs, one round
    python3 bench/wake.py --defaults [--n 12] [--rounds 2] [--idle 3]   # before/now defaults (bench/lib/first_exec.py)

`--defaults` is another benchmark: an idle child's first exec (p50/p90/p99) and its memory while idle, as a fresh
install gets it with the old defaults (no prime, no sleep; with and without a zram swap) and with this tree's (prime
and sleep on, the zram swap scripts/setup.sh makes), side by side in one run. The rest of this text is the default
benchmark's.

Needs swap (zram) and root. Forks `--n` primed children (each ran `true` once), and keeps the daemon's sweeper
running with FORKD_IDLE_SLEEP (forkd.core.idle): idle children are paged out and stopped. Then, side by side:

1. faults: first touch of fresh anonymous memory (an mmap written once per 4 KiB page), in us per page: what any
   page fault costs on this host, which a page-in pays once per page it reads back;
2. page-in: forkd.vmm.pageout.page_in of TCG's code buffer (what a request's page-in reads) on a few paged-out
   children alone: KiB, CPU ms, us per page, and its ratio to (1);
3. squeeze: `exec true` on random sleeping children (each one woken: resumed, its code paged in), in rounds
   interleaved between the host as it is and the host with only `--leave-gib` available (the rest held in
   hugetlb pages, which nothing can swap; put back after each round): p50/p90/p99, host CPU per exec, and the
   kernel's reclaim threads' CPU (kswapd, kcompactd) per exec. Before each round every child is paged out again.

What the figures leave out: the children's memory (bench/density.py measures it); a host whose faults are cheaper
(this one is itself a VM). Every child started here is stopped; the snapshot is kept.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.base.errors import ForkdError  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core.idle import CLK_TCK  # noqa: E402
from forkd.core.requests import Spawn  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.vmm.pageout import PAGE_IN_MAX_KIB, meminfo_kib, page_in  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from density import ensure_snapshot, exec_latencies, parent_tag, pct  # noqa: E402
from lib import first_exec  # noqa: E402
from lib.cli import run_main  # noqa: E402
from lib.density_probes import host_busy_ms, mem_available_kib  # noqa: E402
from lib.sweeper import Sweeper, progress  # noqa: E402

HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
HUGE = 2 << 20
PAGE = 4096


def first_touch_us(mib: int = 64, times: int = 3) -> list[float]:
    """us per 4 KiB page to fault in fresh anonymous memory, `times` runs of `mib` MiB."""
    out = []
    for _ in range(times):
        m = mmap.mmap(-1, mib << 20)
        m.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per 4 KiB page, whatever the host's THP policy
        try:
            t0 = time.thread_time()
            for off in range(0, mib << 20, PAGE):
                m[off] = 1
            out.append(round((time.thread_time() - t0) * 1e6 / ((mib << 20) // PAGE), 2))
        finally:
            m.close()
    return out


def page_in_costs(recs: list) -> list[dict]:
    """page_in (code only) on each of `recs`, alone, as a request's page-in does it."""
    out = []
    for r in recs:
        t0 = time.thread_time()
        kib = page_in(r.pid, r.started, PAGE_IN_MAX_KIB, code_only=True)
        cpu = (time.thread_time() - t0) * 1000.0
        if kib == 0:  # not paged out after all: nothing to measure
            continue
        out.append({"kib": kib, "cpu_ms": round(cpu, 1), "us_per_page": round(cpu * 1000.0 / max(1, kib // 4), 2)})
    return out


def reclaim_ms() -> float:
    """CPU the kernel's reclaim threads (kswapd*, kcompactd*) used since boot, in ms."""
    ticks = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")].startswith(("kswapd", "kcompactd")):
            f = stat.rsplit(")", 1)[1].split()
            ticks += int(f[11]) + int(f[12])
    return ticks * 1000.0 / CLK_TCK


@contextmanager
def squeeze(leave_gib: float | None, hold_gib: float | None = None):
    """The host with only `leave_gib` GiB available (or, given `hold_gib`, with that much less available than now):
    the difference held as hugetlb pages (added to the host's own pool, which is given back as it was) until the
    block ends."""
    if leave_gib is None:
        yield None
        return
    saved, size = int(HUGEPAGES.read_text()), meminfo_kib("Hugepagesize") * 1024 or HUGE
    want = hold_gib * 2**30 if hold_gib else mem_available_kib() * 1024 - leave_gib * 2**30
    extra = max(0, int(want // size))
    try:
        HUGEPAGES.write_text(str(saved + extra))
        yield (int(HUGEPAGES.read_text()) - saved) * size / 2**30
    finally:
        HUGEPAGES.write_text(str(saved))


def round_of(rt: Runtime, recs: list, execs: int, leave_gib: float | None, hold_gib: float | None = None) -> dict:
    with squeeze(leave_gib, hold_gib) as held:
        avail0, busy0, rec0 = mem_available_kib(), host_busy_ms(), reclaim_ms()
        lat = exec_latencies(rt, [r.id for r in recs], execs)
        n = max(1, len(lat))
        row = {"held_gib": round(held or 0.0, 1), "mem_available_gib": round(avail0 / 2**20, 2),
               "mem_available_after_gib": round(mem_available_kib() / 2**20, 2),
               "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99), "max_ms": max(lat),
               "host_cpu_ms_per_exec": round((host_busy_ms() - busy0) / n, 1),
               "reclaim_cpu_ms_per_exec": round((reclaim_ms() - rec0) / n, 1)}
    label = "squeezed" if leave_gib is not None else "as it is"
    progress(f"{label}: MemAvailable {row['mem_available_gib']} GiB, exec p50 {row['p50_ms']:.1f} p99 "
             f"{row['p99_ms']:.1f} ms, host CPU/exec {row['host_cpu_ms_per_exec']}, reclaim "
             f"{row['reclaim_cpu_ms_per_exec']} ms/exec")
    return row


def run(args: argparse.Namespace) -> dict:
    rt = Runtime(Layout(Path(args.home).absolute()))
    image, _ = rt.build_image(progress)
    decision, _ = rt.accelerator(image, progress)
    machine = {"accel": decision.accel, "nproc": len(os.sched_getaffinity(0)), "guest_memory_mib": args.memory_mib,
               "qemu_version": rt.driver.version(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    if args.defaults:
        return run_defaults(rt, args, machine)
    os.environ["FORKD_IDLE_SLEEP"] = "1"  # the sweeper below stops what it pages out, as the daemon would
    hold_gib = None
    if args.leave_gib is None:  # --short: hold back 1 GiB only, of what is available when the round starts
        args.leave_gib, hold_gib = round(max(0.5, mem_available_kib() / 2**20 - 1.0), 1), 1.0
    tag = parent_tag()
    ensure_snapshot(rt, tag, args.memory_mib)
    recs: list = []
    try:
        while len(recs) < args.n:
            recs += rt.fork(Spawn.of(tag=tag, n=min(100, args.n - len(recs)), timeout=120.0, prime=("true",)))
        with Sweeper(rt, args.idle) as sweeper:
            sweeper.wait_paged(recs)
            touch = first_touch_us()
            few, rest = recs[:max(1, min(8, len(recs) // 4))], recs[max(1, min(8, len(recs) // 4)):]
            pin = page_in_costs(few)  # these are paged in now: the rounds use the others
            rows: dict[str, list[dict]] = {"as_is": [], "squeezed": []}
            for rnd in range(args.rounds):
                order = ("as_is", "squeezed") if rnd % 2 == 0 else ("squeezed", "as_is")
                for name in order:
                    sweeper.wait_paged(rest)
                    rows[name].append(round_of(rt, rest, args.execs, args.leave_gib if name == "squeezed" else None,
                                               hold_gib))
    finally:
        rt.kill([r.id for r in recs])
    touch_p50, pin_p50 = pct(touch, 50), pct([p["us_per_page"] for p in pin], 50)
    if not pin:
        raise ForkdError("none of the children measured for the page-in had been paged out",
                         hint="give the sweeper longer (--idle) or check `forkd doctor`'s security:swap")
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"machine": machine, "n": len(recs), "execs": args.execs, "leave_gib": args.leave_gib, "idle_s": args.idle,
            "first_touch_us_per_page": touch, "page_in": pin,
            "page_in_over_first_touch": round(pin_p50 / touch_p50, 2) if touch_p50 else None, "rounds": rows}


def run_defaults(rt: Runtime, args: argparse.Namespace, machine: dict) -> dict:
    tag = parent_tag()
    ensure_snapshot(rt, tag, args.memory_mib)
    out = first_exec.compare(rt, tag, args.n, args.rounds, args.idle)
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"machine": machine, "n": args.n, "rounds": args.rounds, "idle_s": args.idle, "defaults": out,
            "swap": Path("/proc/swaps").read_text().splitlines()[1:]}


def table(r: dict) -> str:
    if "defaults" in r:
        return first_exec.table(r)
    pin = r["page_in"]
    lines = [f"forkd wake benchmark: {r['n']} primed, paged-out, sleeping children; {r['execs']} execs per round",
             f"  page fault on this host (first touch): {pct(r['first_touch_us_per_page'], 50):.2f} us per 4 KiB page "
             f"(runs: {r['first_touch_us_per_page']})",
             f"  page-in of TCG's code buffer: {pct([p['kib'] for p in pin], 50):.0f} KiB, "
             f"{pct([p['cpu_ms'] for p in pin], 50):.1f} ms CPU, {pct([p['us_per_page'] for p in pin], 50):.2f} "
             f"us per page p50 over {len(pin)} children = {r['page_in_over_first_touch']}x a first touch",
             f"  {'host':<34}{'exec p50':>10}{'p90':>8}{'p99':>8}{'CPU ms/exec':>13}{'reclaim ms/exec':>17}"]
    for name, label in (("as_is", "as it is"), ("squeezed", f"{r['leave_gib']} GiB left (hugetlb)")):
        for row in r["rounds"][name]:
            lines.append(f"  {label + ' (' + str(row['mem_available_gib']) + ' GiB avail)':<34}{row['p50_ms']:>10.1f}"
                         f"{row['p90_ms']:>8.1f}{row['p99_ms']:>8.1f}{row['host_cpu_ms_per_exec']:>13.1f}"
                         f"{row['reclaim_cpu_ms_per_exec']:>17.1f}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--home", default=str(settings().home), help="FORKD_HOME (default $FORKD_HOME)")
    ap.add_argument("--n", type=int, default=None, help="children (default 300; with --defaults: per variant and "
                    "round, default 12)")
    ap.add_argument("--execs", type=int, default=100, help="execs per round, each on a random child (default 100)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both hosts (default 2)")
    ap.add_argument("--leave-gib", type=float, default=2.0, help="MemAvailable the squeezed host keeps (default 2)")
    ap.add_argument("--idle", type=float, default=20.0, help="seconds idle before a page-out (default 20)")
    ap.add_argument("--memory-mib", type=int, default=512, help="guest memory (default 512)")
    ap.add_argument("--short", action="store_true", help="CI mode: 6 children (256 MiB), 6 execs, one round, 3 s "
                    "idle, 1 GiB held back")
    ap.add_argument("--defaults", action="store_true", help="an idle child's first exec with the old defaults and "
                    "this tree's, side by side (bench/lib/first_exec.py); uses --n, --rounds, --idle, --memory-mib")
    ap.add_argument("--report", help="also write the JSON report to this file")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    args.n = args.n if args.n is not None else 12 if args.defaults else 300
    if args.n < 2 or args.execs < 1 or args.rounds < 1 or args.leave_gib < 0:
        ap.error("--n must be >= 2 (a few for the page-in, the rest for the rounds), --execs and --rounds >= 1, "
                 "--leave-gib >= 0")
    if args.short:
        args.n, args.execs, args.rounds, args.idle, args.memory_mib = 6, 6, 1, 3.0, 256
        args.leave_gib = None  # run(): all but 1 GiB of what is available then
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if os.geteuid() != 0:
        print("bench failed: needs root (hugetlb pages, process_madvise)", file=sys.stderr)
        return 1
    return run_main(args, run, table)


if __name__ == "__main__":
    sys.exit(main())
