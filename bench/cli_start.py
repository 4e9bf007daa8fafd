#!/usr/bin/env python3
"""CLI start-up per verb: wall time of `forkd VERB` end to end, against the daemon answering on $FORKD_HOME.

    python3 bench/cli_start.py [--runs 20] [--verbs version,ls,...] [--before OTHER/bin/python] [-o json]
                               [--save FILE.json]

Each verb runs `--runs` times in turn (verbs interleaved, so a burst of load on a shared host hits them all alike);
prints wall p50/p90 and CPU (user + system) p50 per verb beside `python -c pass` (the interpreter's own floor).
`--before`: the same verbs with another install's interpreter (e.g. a worktree of the previous commit with its own
venv), each run right after this one's (A B A B), and the ratios this / before.
Start a daemon first (`forkd serve`), else the verbs that need one run in-process and measure that instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VERBS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "--version": ["--version"],
    "version": ["version"],
    "--help": ["--help"],
    "ls": ["ls"],
    "snapshot ls": ["snapshot", "ls"],
    "get pools": ["get", "ForkPool"],
    "exec (bad id)": ["exec", "nosuchchild", "--", "true"],
    "logs (bad id)": ["logs", "nosuchchild"],
    "snapshot info (bad tag)": ["snapshot", "info", "nosuchtag"],
    "snapshot rm (bad tag)": ["snapshot", "rm", "nosuchtag"],
    "kill (bad id)": ["kill", "nosuchchild"],
    "ping (bad id)": ["ping", "nosuchchild"],
    "eval (bad id)": ["eval", "nosuchchild", "1"],
    "fork (bad tag)": ["fork", "--tag", "nosuchtag"],
    "describe (bad pool)": ["describe", "pool/nosuchpool"],
    "gc --dry-run": ["gc", "--dry-run"],
    "audit verify": ["audit", "verify"],
    "config": ["config"],
    "fork --help": ["fork", "--help"],
    "apply --help": ["apply", "--help"],
}


def argv_for(name: str, python: str = sys.executable) -> list[str]:
    """The installed `forkd` entry point beside `python` (what a user runs), else the same entry point by `-c`."""
    cmd = VERBS[name]
    if name.startswith("python"):
        return [python, *cmd[1:]]
    script = Path(python).parent / "forkd"
    return [str(script), *cmd] if script.exists() else [python, "-c", "from forkd.cli import main; main()", *cmd]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(names: list[str], runs: int, pythons: tuple[str, ...] = (sys.executable,)
            ) -> list[dict[str, tuple[list[float], list[float]]]]:
    """Per interpreter, per verb: wall ms and CPU ms (user + system, the child's own: less sensitive to a loaded
    host). The interpreters take turns on each verb."""
    took = [{n: ([], []) for n in names} for _ in pythons]
    for _ in range(runs):
        for n in names:
            for i, py in enumerate(pythons):
                t0, c0 = time.perf_counter(), _cpu()
                subprocess.run(argv_for(n, py), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ))
                took[i][n][0].append((time.perf_counter() - t0) * 1000.0)
                took[i][n][1].append((_cpu() - c0) * 1000.0)
    return took


def summary(took: dict[str, tuple[list[float], list[float]]]) -> dict[str, dict[str, float]]:
    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1] if len(xs) > 1 else xs[0]
    return {n: {"p50_ms": statistics.median(w), "p90_ms": q(w, 90), "cpu_p50_ms": statistics.median(c),
                "runs": len(w)} for n, (w, c) in took.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--verbs", default=",".join(VERBS), help="comma-separated names from: " + ", ".join(VERBS))
    ap.add_argument("--before", metavar="PYTHON", help="also run another install's interpreter, interleaved")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ap.add_argument("--save", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args()
    names = [n.strip() for n in args.verbs.split(",") if n.strip()]
    unknown = [n for n in names if n not in VERBS]
    if unknown:
        ap.error(f"unknown verb name(s) {unknown}; choose from {list(VERBS)}")
    load0 = os.getloadavg()[0]
    took = measure(names, args.runs, (sys.executable, args.before) if args.before else (sys.executable,))
    res = {"load_1m": [load0, os.getloadavg()[0]], "cpus": os.cpu_count(), "verbs": summary(took[0])}
    if args.before:
        res["before"] = summary(took[1])
    if args.save:
        Path(args.save).write_text(json.dumps(res, indent=2) + "\n")
    if args.output == "json":
        print(json.dumps(res, indent=2))
        return
    print(f"load average {load0:.2f} -> {res['load_1m'][1]:.2f} on {res['cpus']} CPUs; {args.runs} runs each")
    for n, s in res["verbs"].items():
        line = (f"  {n:<16} wall p50 {s['p50_ms']:7.1f} ms  p90 {s['p90_ms']:7.1f} ms"
                f"   CPU p50 {s['cpu_p50_ms']:7.1f} ms")
        if args.before:
            b = res["before"][n]
            line += (f"   | before: wall p50 {b['p50_ms']:7.1f}  CPU p50 {b['cpu_p50_ms']:7.1f}"
                     f"   ratio wall {s['p50_ms'] / b['p50_ms']:.2f} CPU {s['cpu_p50_ms'] / b['cpu_p50_ms']:.2f}")
        print(line)


if __name__ == "__main__":
    main()
