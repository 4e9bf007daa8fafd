#!/usr/bin/env python3
"""The crash harness over many seeds: daemon kills (with CLI processes killed beside them), a dated report, and
each failing round replayed from its seed.

    python3 bench/chaos.py [--seeds 10] [--first-seed 100] [--kills 50] [--jobs 1] [--image-from HOME] [--out DIR]
                           [--label L]
    nohup nice -n 19 python3 bench/chaos.py --seeds 10 --kills 50 --label long > chaos.log 2>&1 &   # hours (TCG)

Each seed runs tests.chaos.harness on a fresh private $FORKD_HOME (`python -m tests.chaos --seed S --kills K`),
one after another, or `--jobs N` seeds at once (each its own home, daemon and thread; a kill in one seed does not
touch the others, but they share the CPUs, so recovery times are longer than one seed alone would see).
Then every failing round is replayed once, alone, on a fresh home (`--round N`: a round's
operations and kill point depend on its seed and number only; what the VMs do meanwhile is timing, so a replay
may hold where the run did not: the report says which). The report, `<out>/chaos-<UTC date>[-LABEL].md` (and
`.json`), gives the kills survived, the CLI processes killed with them, the time to recover (daemon restart ->
every pool back at target) p50/p90 over every round, each violation with its seed, round and replay command, and
the replays' outcome. It is rewritten after every round, with a status line (in progress, complete, stopped early)
saying how many of the planned kills completed: SIGTERM or SIGINT tears the seed in progress down (its VMs and
home removed), writes the report of every kill completed so far and exits 2. Exits 1 if any round failed or a
seed ended early.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.base.atomic import write_bytes  # noqa: E402
from tests.chaos.harness import Chaos, Config, Report, run  # noqa: E402
from tests.chaos.invariants import CATEGORIES  # noqa: E402
from tests.chaos.rig import log  # noqa: E402

REPLAYS_KEPT = 5  # failing rounds replayed at most (each needs a fresh home: minutes)


def failing(reports: list[Report]) -> list[tuple[int, int, list[str]]]:
    """(seed, round, violations) of every round that failed, in run order."""
    return [(rep.seed, r.n, [f"{c}: {v}" for c in CATEGORIES for v in r.violations.get(c, [])])
            for rep in reports for r in rep.rounds if not r.survived]


def totals(reports: list[Report]) -> dict:
    kills = [r for rep in reports for r in rep.kills()]
    rec = sorted(r.recover_s for r in kills if r.recover_s is not None)
    pct = (statistics.median(rec), rec[min(len(rec) - 1, int(0.9 * len(rec)))]) if rec else None
    ups = sorted(r.daemon_up_s for r in kills if r.daemon_up_s is not None)
    return {"seeds": [rep.seed for rep in reports], "kills": len(kills), "survived": sum(r.survived for r in kills),
            "cli_killed": sum(len(r.killed_cli) for r in kills),
            "never_recovered": sum(r.recover_s is None for r in kills),
            "recover_p50_s": pct and round(pct[0], 2), "recover_p90_s": pct and round(pct[1], 2),
            "daemon_up_p50_s": round(statistics.median(ups), 2) if ups else None,
            "daemon_up_max_s": round(ups[-1], 2) if ups else None,
            "leaked_qemu": sorted(p for rep in reports for p in rep.leaked_qemu)}


def markdown(day: str, t: dict, fails: list, replays: dict, cmdline: str, progress: str = "complete") -> str:
    lines = [f"# Crash harness over {len(t['seeds'])} seeds, {day}", "", f"Command: `{cmdline}`", "",
             f"Status: {progress}", "",
             f"- seeds: {', '.join(map(str, t['seeds']))}",
             f"- daemon kills: {t['kills']}, survived with every invariant holding: {t['survived']}",
             f"- CLI processes killed with them: {t['cli_killed']}",
             f"- time to recover (daemon restart -> every pool at target): p50 {t['recover_p50_s']} s, "
             f"p90 {t['recover_p90_s']} s; rounds that never recovered: {t['never_recovered']}",
             f"- restarted daemon answering: p50 {t['daemon_up_p50_s']} s, max {t['daemon_up_max_s']} s",
             f"- QEMU processes left at the end (leaks): {t['leaked_qemu'] or 'none'}", "", "## Violations", ""]
    if not fails:
        lines.append("None.")
    for seed, n, vs in fails:
        again = replays.get(f"{seed}:{n}")
        told = "not replayed" if again is None else "violated again" if again else "held on replay (timing)"
        lines.append(f"- seed {seed} round {n} ({told}; replay: `python -m tests.chaos --seed {seed} --round {n}`)")
        lines += [f"    - {v[:2000]}" for v in vs]  # whole in the .json
    return "\n".join(lines) + "\n"


class Stopped(BaseException):
    """SIGTERM or SIGINT: the seed in progress is torn down (its home removed) and the report says so. Not an
    Exception: the harness's and forkd's `except Exception` (a check that records what failed) must not swallow it."""


def _stop(signum, _frame) -> None:
    raise Stopped(signal.Signals(signum).name)


class Run:
    """The seeds run so far and the dated report, rewritten after every round: a run stopped at any point leaves
    a report of every kill it completed."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.reports: list[Report] = []  # finished seeds, then the one in progress
        self.errors: list[str] = []  # seeds that could not run to the end (setup failed, stopped)
        self.replays: dict[str, bool] = {}
        self.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.day = time.strftime("%Y-%m-%d", time.gmtime())
        self.cmdline = "python3 bench/chaos.py " + " ".join(sys.argv[1:])
        self.name = f"chaos-{self.day}" + (f"-{args.label}" if args.label else "")
        self.lock = threading.RLock()  # seeds run in threads with --jobs: reports and the report file are shared
        self.active: list[Chaos] = []
        self.stopping = threading.Event()  # set by a stop: no seed starts, no round finishing in teardown counts

    def progress(self, state: str) -> str:
        done = sum(len(r.kills()) for r in self.reports)
        planned = self.args.seeds * self.args.kills
        now = time.strftime("%H:%M UTC", time.gmtime())
        text = (f"{state}; started {self.started}, last written {now}; {done} of {planned} planned kills "
                f"({self.args.seeds} seeds x {self.args.kills}) completed over {len(self.reports)} seeds")
        return text + "".join(f"; {e}" for e in self.errors)

    def write(self, state: str) -> str:
        with self.lock:
            return self._write(state)

    def _write(self, state: str) -> str:
        t = totals(self.reports)
        fails = failing(self.reports)
        text = markdown(self.day, t, fails, self.replays, self.cmdline, self.progress(state))
        out = self.args.out
        out.mkdir(parents=True, exist_ok=True)
        write_bytes(out / f"{self.name}.md", text.encode(), durable=False)
        write_bytes(out / f"{self.name}.json", (json.dumps(
            {"date": self.day, "command": self.cmdline, "status": self.progress(state), **t,
             "replays": self.replays,
             "violations": [{"seed": s, "round": n, "violations": vs} for s, n, vs in fails]},
            indent=2) + "\n").encode(), durable=False)
        return text

    def seed(self, seed: int) -> None:
        if self.stopping.is_set():
            return
        cfg = Config(kills=self.args.kills, seed=seed, max_load=self.args.max_load, image_from=self.args.image_from,
                     on_round=lambda _rep: self.write("in progress"))
        chaos = Chaos(cfg)
        with self.lock:
            self.reports.append(chaos.report)
            self.active.append(chaos)
        try:
            chaos.run()
        except Stopped as exc:
            self.errors.append(f"stopped by {exc} during seed {seed}")
            raise
        except Exception as exc:  # noqa: BLE001 - one seed that cannot set up must not lose the others
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            if not self.stopping.is_set():  # else the stop's own teardown broke it: the stop is reported once
                self.errors.append(f"seed {seed} ended early after {len(chaos.report.kills())} kills: {first[:300]}")
        finally:
            chaos.close()
            with self.lock:
                self.active.remove(chaos) if chaos in self.active else None
            log(chaos.report.summary())
        self.write("in progress")

    def seeds(self, seeds: range) -> None:
        """Run the seeds, `--jobs` at once; SIGTERM/SIGINT (raised in this, the main, thread) tears down all."""
        if self.args.jobs <= 1:
            for seed in seeds:
                self.seed(seed)
            return
        pool = ThreadPoolExecutor(max_workers=self.args.jobs, thread_name_prefix="seed")
        futures = [pool.submit(self.seed, seed) for seed in seeds]
        try:
            for f in futures:
                while not f.done():
                    time.sleep(1.0)  # polled, not f.result(): a signal handler runs only between bytecodes here
        except Stopped as exc:
            with self.lock:
                self.stopping.set()
                self.errors.append(f"stopped by {exc} with {len(self.active)} seeds in progress")
                running = list(self.active)
                self.freeze(running)
            for chaos in running:
                chaos.close()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def freeze(self, running: list[Chaos]) -> None:
        """Keep the rounds the running seeds completed before the stop: a round that ends while its home is torn
        down would report the teardown as a violation."""
        for chaos in running:
            frozen = dataclasses.replace(chaos.report, rounds=list(chaos.report.rounds))
            self.reports[self.reports.index(chaos.report)] = frozen

    def replay(self) -> None:
        for seed, n, _ in failing(self.reports)[:REPLAYS_KEPT]:
            again = run(Config(kills=n, seed=seed, max_load=self.args.max_load, image_from=self.args.image_from,
                               rounds=(n,)))
            self.replays[f"{seed}:{n}"] = any(not r.survived for r in again.kills())
            self.write("replaying failing rounds")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="how many seeds (consecutive from --first-seed)")
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--kills", type=int, default=50, help="daemon kills per seed")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at once (each its own home and daemon)")
    ap.add_argument("--max-load", type=float, default=20.0, help="most seconds of load before a kill")
    ap.add_argument("--image-from", type=Path, default=Path("/var/lib/forkd"),
                    help="copy the guest image from this home instead of building one")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "reports",
                    help="directory of the dated report")
    ap.add_argument("--label", default="", help="report name suffix: <out>/chaos-<UTC date>[-LABEL].md")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    job = Run(args)
    job.write("starting")
    try:
        job.seeds(range(args.first_seed, args.first_seed + args.seeds))
        job.replay()
    except Stopped:
        print(job.write("stopped early"))
        return 2
    text = job.write("complete" if not job.errors else "complete, with seeds that ended early")
    print(text)
    t = totals(job.reports)
    return 1 if failing(job.reports) or t["leaked_qemu"] or job.errors else 0


if __name__ == "__main__":
    sys.exit(main())
