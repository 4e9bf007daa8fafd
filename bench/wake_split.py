#!/usr/bin/env python3
"""Where the CPU of an idle child's first exec goes: the VMM and forkd's threads, per way of paging it back in.

    python3 bench/wake_split.py [--home DIR] [--n 8] [--ways code,off] [-o json]

Forks `--n` children (primed, as shipped), lets the daemon's sweeper (forkd.core.idle, idle 3 s) put them to sleep
and page them out, then runs one `exec true` on each, the children taken in turn by each way in `--ways`:
`code` (as shipped: TCG's translation buffer paged in on another thread while the request runs), `off`
(FORKD_PAGE_IN_ON_REQUEST=0: the VMM faults back what it touches), `all` (FORKD_PAGE_IN_SCOPE=all), `before`
(the translation buffer read back on the request's thread before it resumes the child), `resident` (everything
read back before the exec, not counted: what waking costs without any page fault). Then a second `exec true` on
each (`warm`). Per exec: the VMM's CPU (every thread's schedstat run time, ns), its major faults, this process's
CPU until the exec returned (`forkd_request_ms`) and once the page-in thread is done too (`forkd_ms`; the sweeper
is stopped first), the page-in thread's own, what was in swap before and after.
Needs root and a zram swap (scripts/zram.sh)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from density import ensure_snapshot, parent_tag  # noqa: E402
from lib.cli import run_main  # noqa: E402
from lib.sweeper import Sweeper  # noqa: E402

from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core.requests import Spawn  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.sandbox import wake  # noqa: E402
from forkd.vmm.pageout import page_in, status_kib  # noqa: E402

WAYS = ("code", "off", "all", "before", "resident")
ENV = {"code": {}, "off": {"FORKD_PAGE_IN_ON_REQUEST": "0"}, "all": {"FORKD_PAGE_IN_SCOPE": "all"},
       "before": {}, "resident": {}}


def vmm_ms(pid: int) -> float:
    """CPU run time of every thread of `pid` so far, ms (schedstat: nanoseconds, not clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e6


def majflt(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[9])


class PageInClock:
    """The CPU of each page-in thread (forkd.sandbox.wake), by VMM pid."""

    def __init__(self):
        self.ms: dict[int, float] = {}
        self.orig = wake._page_in
        wake._page_in = self._timed

    def _timed(self, pid: int, started: int | None) -> None:
        c0 = time.thread_time()
        self.orig(pid, started)
        self.ms[pid] = (time.thread_time() - c0) * 1000.0


def one_exec(rt: Runtime, rec, way: str, pins: PageInClock) -> dict:
    saved = {k: os.environ.get(k) for k in ENV[way]}
    os.environ.update(ENV[way])
    try:
        if way == "resident":
            wake.page_in_now(rec.pid, rec.started, 0)
        swapped, v0, f0, c0 = status_kib(rec.pid, "VmSwap"), vmm_ms(rec.pid), majflt(rec.pid), time.process_time()
        if way == "before":
            page_in(rec.pid, rec.started, code_only=True)
        t0 = time.perf_counter()
        assert rt.exec(rec.id, ["true"])["exit_code"] == 0
        wall = (time.perf_counter() - t0) * 1000.0
        forkd = (time.process_time() - c0) * 1000.0
        deadline = time.monotonic() + 10  # the page-in thread may still be at it
        while wake._running.get(rec.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the VMM finishes the exec's tail (the reply is out before its last CPU)
        return {"wall_ms": wall, "forkd_ms": (time.process_time() - c0) * 1000.0, "forkd_request_ms": forkd,
                "vmm_ms": vmm_ms(rec.pid) - v0, "vmm_major_faults": majflt(rec.pid) - f0,
                "page_in_thread_ms": pins.ms.pop(rec.pid, 0.0), "swap_before_kib": swapped,
                "swap_after_kib": status_kib(rec.pid, "VmSwap")}
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def run(args: argparse.Namespace) -> dict:
    rt = Runtime(Layout(Path(args.home).absolute()))
    tag = parent_tag()
    ensure_snapshot(rt, tag, 512)
    pins, rows = PageInClock(), {w: [] for w in [*args.ways, "warm"]}
    load0, recs = os.getloadavg()[0], []
    try:
        recs = rt.fork(Spawn.of(tag=tag, n=args.n, timeout=600.0))
        with Sweeper(rt, 3.0) as sweeper:
            sweeper.wait_paged(recs, limit_s=600.0)
        for i, rec in enumerate(recs):
            rows[args.ways[i % len(args.ways)]].append(one_exec(rt, rec, args.ways[i % len(args.ways)], pins))
            rows["warm"].append(one_exec(rt, rec, "code", pins))
    finally:
        rt.kill([r.id for r in recs])
    med = {w: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]} for w, rs in rows.items() if rs}
    return {"n": args.n, "loadavg": [round(load0, 1), round(os.getloadavg()[0], 1)], "median": med, "rows": rows,
            "page_in_scope": settings().page_in_scope}


def table(r: dict) -> str:
    lines = [f"first exec after page-out, CPU split ({r['n']} children; load {r['loadavg'][0]} -> {r['loadavg'][1]})",
             f"  {'way':<10}{'n':>3}{'VMM ms':>8}{'faults':>8}{'forkd ms':>10}{'page-in':>9}{'total':>7}"
             f"{'wall ms':>9}{'swap KiB':>18}"]
    for w, m in r["median"].items():
        n = len(r["rows"][w])
        lines.append(f"  {w:<10}{n:>3}{m['vmm_ms']:>8.1f}{m['vmm_major_faults']:>8.0f}{m['forkd_ms']:>10.1f}"
                     f"{m['page_in_thread_ms']:>9.1f}{m['vmm_ms'] + m['forkd_ms']:>7.1f}{m['wall_ms']:>9.1f}"
                     f"{m['swap_before_kib']:>9.0f}->{m['swap_after_kib']:<8.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", default=str(settings().home), help="FORKD_HOME (default $FORKD_HOME)")
    ap.add_argument("--n", type=int, default=8, help="children (default 8), shared out among --ways in turn")
    ap.add_argument("--ways", default="code,off", help=f"comma-separated, of {', '.join(WAYS)} (default code,off)")
    ap.add_argument("--report", help="also write the JSON report to this file")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    args.ways = args.ways.split(",")
    if bad := [w for w in args.ways if w not in WAYS]:
        ap.error(f"--ways: {', '.join(bad)} not one of {', '.join(WAYS)}")
    if os.geteuid() != 0:
        print("bench failed: needs root (process_madvise, a zram swap)", file=sys.stderr)
        return 1
    return run_main(args, run, table)


if __name__ == "__main__":
    sys.exit(main())
