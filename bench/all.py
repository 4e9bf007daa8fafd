#!/usr/bin/env python3
"""Every benchmark in one command: a dated report page, its JSON and PNG plots, from a single run:

    python3 bench/all.py --short [--home DIR] [--out docs/benchmarks] [--only fork,density] [--with-images]
                                 [--with-wake]
    python -m bench.all --short

Runs each script of bench/ as its own process (each with `-o json`, or its JSON flag), one after the other, on one
FORKD_HOME (default: a fresh private directory under /dev/shm, removed afterwards, so live branches work), and
writes `<out>/<YYYY-MM-DD>.json` (per benchmark its command, exit status, wall time and parsed JSON, or its
output's tail when it failed), `<out>/<YYYY-MM-DD>.md` (the host: cores, accelerator, kernel, QEMU, commit; the
load average at start and end and sampled during the run; per benchmark its figures, each saying what it
measures) and the plots beside them (a second run on one day gets `<date>-2`):
  * <date>-fork-latency-cdf.png: fork -> first eval latency CDF of the sequential forks and of the fan-out;
  * <date>-fanout-timeline.png: children answering an eval over time since the fan-out request;
  * <date>-memory-per-child.png: host memory per idle child (MemAvailable drop and summed Pss) against N.
With the default --out, docs/benchmarks.md's list of reports (between its markers) is rewritten, the newest first:
the docs quote only that report. `--short` uses settings that finish in a few minutes on 2 cores (figures are then
indicative only); without it each benchmark runs with its own defaults (long). images.py builds Debian images
with mmdebstrap (slow, needs the .deb cache): only with --with-images; wake.py (root, a zram swap, most of the
host's memory held in hugetlb pages for a few seconds) only with --with-wake. Exit status: 0 when every benchmark
succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DOCS = ROOT / "docs" / "benchmarks"
INDEX_PAGE = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(BENCH))  # bench/lib, also under `python -m bench.all`

from lib import dated  # noqa: E402
from lib.figures import plan_result  # noqa: E402

# name -> (arguments in --short mode, arguments otherwise, flag that makes it print JSON)
SUITE: dict[str, tuple[list[str], list[str], list[str]]] = {
    "plan": (["--runs", "3"], [], []),
    "fork": (["--cold", "2", "--forks", "3", "--fanout", "4"], [], ["-o", "json"]),
    "density": (["--short"], [], ["-o", "json"]),
    "branch": (["--sizes", "512", "--reps", "2"], [], ["-o", "json"]),
    "chain": (["--spawns", "2", "--memory-mib", "256"], [], ["-o", "json"]),
    "pool": (["--claims", "3"], [], ["-o", "json"]),
    "api": (["--calls", "10"], [], ["-o", "json"]),
    "isolation": (["--n", "2"], [], ["--json"]),
    "images": (["--runs", "2"], [], ["-o", "json"]),
    "wake": (["--short"], [], ["-o", "json"]),
}
TAKES_HOME = {"fork", "density", "chain", "pool", "api", "images", "wake"}  # the others read FORKD_HOME


def run_unwinding(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run one benchmark; past `timeout` it gets SIGTERM first (each unwinds: its children stopped, wake.py's
    hugetlb pages given back), SIGKILL only if it has not ended 60 s later."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                out, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            err += f"\n(stopped after {timeout:.0f} s: --timeout)"
        return subprocess.CompletedProcess(argv, p.returncode, out, err)


def progress(msg: str) -> None:
    print(f"[bench-all {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_json(text: str):
    """The JSON document a benchmark printed (the last top-level object in its stdout), or None."""
    start = text.find("{")
    while start >= 0:
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            start = text.find("\n{", start + 1)
            start = start + 1 if start >= 0 else -1
    return None


def run_one(name: str, args: argparse.Namespace, home: Path) -> dict:
    short, full, as_json = SUITE[name]
    argv = [sys.executable, str(BENCH / f"{name}.py"), *(short if args.short else full), *as_json]
    if name in TAKES_HOME:
        argv += ["--home", str(home)]
    env = dict(os.environ, FORKD_HOME=str(home), PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    progress(f"{name}: {' '.join(argv[1:])}")
    t0 = time.perf_counter()
    res = run_unwinding(argv, env, args.timeout)
    took = time.perf_counter() - t0
    out = {"command": [os.path.relpath(argv[1], ROOT), *argv[2:]], "exit_code": res.returncode,
           "seconds": round(took, 1)}
    data = parse_json(res.stdout) if as_json else plan_result(res.stdout) if name == "plan" else None
    if data is not None:
        out["result"] = data
    else:
        out["output"] = res.stdout[-4000:]
    if res.returncode != 0:
        out["stderr_tail"] = res.stderr[-4000:]
    progress(f"{name}: exit {res.returncode} in {took:.0f} s")
    return out


# -- plots ------------------------------------------------------------------------------------------
def cdf(ax, samples: list[float], label: str) -> None:
    xs = sorted(samples)
    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{label} (n={len(xs)})")


def plot(report: dict, out: Path, stem: str) -> dict[str, str]:
    """The three PNGs (`<stem>-*.png` in `out`) from whatever benchmarks in `report` succeeded: "bench:file" ->
    caption, a caption saying what the plot measures."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: dict[str, str] = {}
    fork = report["benchmarks"].get("fork", {}).get("result")
    density = report["benchmarks"].get("density", {}).get("result")
    if fork:
        fig, ax = plt.subplots(figsize=(6, 4))
        cdf(ax, fork["fork"]["samples"], "sequential fork -> eval")
        cdf(ax, fork["fanout"]["eval_done_after_request_ms"]["samples"], f"fan-out of {fork['fanout']['n']}")
        if fork.get("cold", {}).get("samples"):
            ax.axvline(fork["cold"]["p50"], color="grey", ls="--", label=f"cold boot p50 {fork['cold']['p50']:.0f} ms")
        ax.set(xscale="log", xlabel="ms from request to an answered eval", ylabel="fraction of children",
               title=f"fork latency ({fork['machine']['accelerator']}, {fork['machine']['nproc']} cores)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written[f"fork:{save(fig, out / f'{stem}-fork-latency-cdf.png')}"] = (
            "fork latency: ms from the fork request until the child answered an eval (sequential forks and the "
            "fan-out's children), against one cold boot's p50")

        fig, ax = plt.subplots(figsize=(6, 4))
        done = sorted(fork["fanout"]["eval_done_after_request_ms"]["samples"])
        ax.step([0, *[t / 1000.0 for t in done]], range(len(done) + 1), where="post", label="answered an eval")
        n, s = fork["fanout"]["n"], fork["fanout"]["all_eval_ms"] / 1000.0
        ax.plot([0, s], [0, n], ls=":", color="grey", label=f"mean {n / s:.1f} children/s")
        ax.plot([0, n / 25.0], [0, n], ls="--", color="green", alpha=0.5, label="target 25 children/s")
        ax.set(xlabel="seconds since the fan-out request", ylabel="children answering",
               title=f"fan-out of {n} children")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written[f"fork:{save(fig, out / f'{stem}-fanout-timeline.png')}"] = (
            "fan-out: how many of its children had answered an eval, over time since the one request")
    if density:
        # the final window (longer, at full N) stands for the last level it repeats
        pts = [p for p in density["levels"] if p["n"] != density["final"]["n"]] + [density["final"]]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p["n"] for p in pts], [p["mem_per_child_mib"] for p in pts], "o-", label="MemAvailable drop / N")
        ax.plot([p["n"] for p in pts], [p["pss_per_child_mib"] for p in pts], "s-", label="summed Pss / N")
        ax.axhline(density["targets"]["mem_mib"], color="green", ls="--", alpha=0.5, label="target")
        ax.set(xlabel="idle children (N)", ylabel="MiB per child", ylim=(0, None),
               title=f"host memory per idle child ({density['machine']['guest_memory_mib']} MiB guests)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        written[f"density:{save(fig, out / f'{stem}-memory-per-child.png')}"] = (
            "host memory per idle child against N: the host's MemAvailable drop / N and the QEMU processes' summed "
            "Pss / N (VMM included; guest private pages alone are a smaller figure, in the density table)")
    return written


def save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path.name


def options(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (see the module doc)",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--short", action="store_true", help="short settings (minutes, indicative figures)")
    ap.add_argument("--home", help="FORKD_HOME to use (default: a fresh one under /dev/shm, removed afterwards)")
    ap.add_argument("--out", default=str(DOCS), help="where the dated page, its JSON and PNGs go (default "
                    "docs/benchmarks, which also rewrites docs/benchmarks.md's list of reports)")
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(SUITE)}")
    ap.add_argument("--with-images", action="store_true", help="also run images.py (builds Debian images)")
    ap.add_argument("--with-wake", action="store_true", help="also run wake.py (root and a zram swap; holds most of "
                    "the host's memory in hugetlb pages for a few seconds)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark (default 3600)")
    ap.add_argument("--replot", action="store_true", help="only redraw the newest report's PNGs and page")
    args = ap.parse_args(argv)
    args.names = args.only.split(",") if args.only else [n for n in SUITE if (n != "images" or args.with_images)
                                                         and (n != "wake" or args.with_wake)]
    unknown = [n for n in args.names if n not in SUITE]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(SUITE)}")
    return args


def run_all(args: argparse.Namespace, out: Path) -> dict:
    """Run the benchmarks on one home, sampling the load meanwhile; the report without its plots."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="forkd-bench-", dir=base))
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter()
    load = dated.LoadSampler().start()
    report: dict = {"started": started, "short": args.short, "home": str(home), "host": dated.host_facts(ROOT),
                    "command": " ".join(["python3 bench/all.py", *sys.argv[1:]]), "benchmarks": {}}
    try:
        for name in args.names:
            report["benchmarks"][name] = run_one(name, args, home)
        report["accel"] = dated.accel_of(report["benchmarks"], home)
    finally:
        report["load"] = load.stop()
        if not args.home:
            subprocess.run([sys.executable, "-m", "forkd.cli.main", "kill", "--all"], env=dict(
                os.environ, FORKD_HOME=str(home), FORKD_NO_DAEMON="1"), capture_output=True, cwd=ROOT)
            shutil.rmtree(home, ignore_errors=True)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["stem"] = dated.stem_for(out, started[:10])
    return report


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        newest = dated.reports_in(out)
        if not newest:
            sys.exit(f"no dated report in {out}: run bench/all.py first")
        report = json.loads(newest[0].with_suffix(".json").read_text())
    else:
        report = run_all(args, out)
    report["plots"] = plot(report, out, report["stem"])
    _, page = dated.write(out, report, report["plots"])
    if out == DOCS.resolve():
        dated.update_index(INDEX_PAGE, out)
    failed = [n for n, r in report["benchmarks"].items() if r["exit_code"] != 0]
    print(f"report: {page}; plots: {', '.join(p.split(':', 1)[1] for p in report['plots']) or 'none'}")
    for n, r in report["benchmarks"].items():
        status = "ok" if r["exit_code"] == 0 else f"FAILED (exit {r['exit_code']})"
        print(f"  {n:<10} {status:<16} {r['seconds']:>7.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
