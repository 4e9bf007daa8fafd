#!/usr/bin/env python3
"""Jail benchmark: what jailing each VMM (its own network, mount and pid namespaces, an empty root) costs, side by
side.

    FORKD_HOME=/dev/shm/fkj python3 bench/jail.py [--reps 10] [--fanout 6] [-o json] [--report FILE]

Children without a network device get an empty network namespace of their own, every VMM a mount and a pid
namespace of its own and an empty root (FORKD_VMM_JAIL=1, the default), or none of these (=0). The two settings
alternate rep by rep against one warm 512 MiB parent (`bench-jail`, made if missing), so load on the host falls on
both alike:
* fork: one child, from the call to its agent answering a ping (p50/p90);
* fan-out: `--fanout` children in one fork call, until all answered (p50/p90 of the call);
* live branch: the source's pause (QEMU's STOP..RESUME) of a live branch of a child of each setting (p50/p90).
Ratios are jailed / shared (p50). What it leaves out: the namespace's teardown happens at kill, outside the timed
spans (its cost is reported separately from the children's kill timings it does not see), and KVM hosts.
Writes a dated report under bench/reports/ unless --report names another file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.isolation import ensure as ensure_parent  # noqa: E402
from bench.isolation import pct  # noqa: E402
from bench.lib.cli import run_main  # noqa: E402
from forkd.core.branch import branch, wait_background  # noqa: E402
from forkd.core.requests import Branch, Spawn  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402

TAG = "bench-jail"
SETTINGS = {"jailed": "1", "shared": "0"}


def ensure(rt: Runtime) -> None:
    ensure_parent(rt, TAG, "none")


def one_rep(rt: Runtime, fanout: int, out: dict[str, dict[str, list[float]]], mode: str) -> None:
    os.environ["FORKD_VMM_JAIL"] = SETTINGS[mode]
    t0 = time.perf_counter()
    (rec,) = rt.fork(Spawn.of(tag=TAG, n=1))
    rt.ping(rec.id)
    out[mode]["fork"].append((time.perf_counter() - t0) * 1000.0)
    t0 = time.perf_counter()
    many = rt.fork(Spawn.of(tag=TAG, n=fanout))
    for r in many:
        rt.ping(r.id)
    out[mode]["fanout"].append((time.perf_counter() - t0) * 1000.0)
    rt.kill([r.id for r in many])
    res = branch(rt, Branch.of(child_id=rec.id, tag=f"bench-jail-b-{mode}", mode="live"))
    wait_background(rt)
    if res.pause_ms is not None:
        out[mode]["branch_pause"].append(res.pause_ms)
    rt.kill([rec.id])
    rt.rmi(f"bench-jail-b-{mode}", force=True)


def run(a: argparse.Namespace) -> dict:
    rt = Runtime()
    ensure(rt)
    out = {m: {"fork": [], "fanout": [], "branch_pause": []} for m in SETTINGS}
    try:
        for mode in SETTINGS:  # warm-up, not counted: first fork per process pays imports
            os.environ["FORKD_VMM_JAIL"] = SETTINGS[mode]
            rt.kill([r.id for r in rt.fork(Spawn.of(tag=TAG, n=1))])
        for i in range(a.reps):
            for mode in (SETTINGS if i % 2 == 0 else reversed(SETTINGS)):  # alternate which goes first
                one_rep(rt, a.fanout, out, mode)
                print(f"rep {i + 1}/{a.reps} {mode} done", file=sys.stderr)
    finally:
        os.environ.pop("FORKD_VMM_JAIL", None)
    stats = {m: {k: {"p50": statistics.median(v), "p90": pct(v, 0.9), "n": len(v)} for k, v in d.items() if v}
             for m, d in out.items()}
    ratios = {k: stats["jailed"][k]["p50"] / stats["shared"][k]["p50"]
              for k in stats["jailed"] if k in stats["shared"]}
    result = {"date": datetime.date.today().isoformat(), "reps": a.reps, "fanout": a.fanout, "stats": stats,
              "ratio_p50_jailed_over_shared": ratios, "samples": out}
    if not a.report:
        reports = Path(__file__).resolve().parent / "reports"
        reports.mkdir(exist_ok=True)
        a.report = str(reports / f"jail-{result['date']}.json")
    return result


def table(r: dict) -> str:
    lines = [f"jail benchmark {r['date']}: {r['reps']} reps, fan-out {r['fanout']} "
             "(ms; jailed: own net, mount and pid namespaces, empty root)"]
    for k in ("fork", "fanout", "branch_pause"):
        if k not in r["ratio_p50_jailed_over_shared"]:
            continue
        j, s = r["stats"]["jailed"][k], r["stats"]["shared"][k]
        lines.append(f"  {k:13s} jailed p50 {j['p50']:8.1f} p90 {j['p90']:8.1f} | shared p50 {s['p50']:8.1f} "
                     f"p90 {s['p90']:8.1f} | ratio {r['ratio_p50_jailed_over_shared'][k]:.3f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--fanout", type=int, default=6)
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ap.add_argument("--report", help="where the JSON report goes (default bench/reports/jail-DATE.json)")
    return run_main(ap.parse_args(), run, table)


if __name__ == "__main__":
    sys.exit(main())
