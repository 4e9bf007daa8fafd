#!/usr/bin/env python3
"""The crash harness over many seeds: daemon kills (with CLI processes killed beside them), a dated report, and
each failing round replayed from its seed.

    python3 bench/chaos.py [--seeds 10] [--first-seed 100] [--kills 50] [--image-from HOME] [--out DIR]
    nohup python3 bench/chaos.py --seeds 10 --kills 50 > chaos.log 2>&1 &     # >= 500 kills: hours under TCG

Each seed runs tests.chaos.harness on a fresh private $FORKD_HOME (`python -m tests.chaos --seed S --kills K`),
one after another. Then every failing round is replayed once, alone, on a fresh home (`--round N`: a round's
operations and kill point depend on its seed and number only; what the VMs do meanwhile is timing, so a replay
may hold where the run did not: the report says which). The report, `<out>/chaos-<UTC date>.md` (and `.json`),
gives the kills survived, the CLI processes killed with them, the time to recover (daemon restart -> every pool
back at target) p50/p90 over every round, each violation with its seed, round and replay command, and the replays'
outcome. Exits 1 if any round failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.harness import Config, Report, run  # noqa: E402
from tests.chaos.invariants import CATEGORIES  # noqa: E402

REPLAYS_KEPT = 5  # failing rounds replayed at most (each needs a fresh home: minutes)


def failing(reports: list[Report]) -> list[tuple[int, int, list[str]]]:
    """(seed, round, violations) of every round that failed, in run order."""
    return [(rep.seed, r.n, [f"{c}: {v}" for c in CATEGORIES for v in r.violations.get(c, [])])
            for rep in reports for r in rep.rounds if not r.survived]


def totals(reports: list[Report]) -> dict:
    kills = [r for rep in reports for r in rep.kills()]
    rec = sorted(r.recover_s for r in kills if r.recover_s is not None)
    pct = (statistics.median(rec), rec[min(len(rec) - 1, int(0.9 * len(rec)))]) if rec else None
    return {"seeds": [rep.seed for rep in reports], "kills": len(kills), "survived": sum(r.survived for r in kills),
            "cli_killed": sum(len(r.killed_cli) for r in kills),
            "never_recovered": sum(r.recover_s is None for r in kills),
            "recover_p50_s": pct and round(pct[0], 2), "recover_p90_s": pct and round(pct[1], 2),
            "leaked_qemu": sorted(p for rep in reports for p in rep.leaked_qemu)}


def markdown(day: str, t: dict, fails: list, replays: dict, cmdline: str) -> str:
    lines = [f"# Crash harness over {len(t['seeds'])} seeds, {day}", "", f"Command: `{cmdline}`", "",
             f"- seeds: {', '.join(map(str, t['seeds']))}",
             f"- daemon kills: {t['kills']}, survived with every invariant holding: {t['survived']}",
             f"- CLI processes killed with them: {t['cli_killed']}",
             f"- time to recover (daemon restart -> every pool at target): p50 {t['recover_p50_s']} s, "
             f"p90 {t['recover_p90_s']} s; rounds that never recovered: {t['never_recovered']}",
             f"- QEMU processes left at the end (leaks): {t['leaked_qemu'] or 'none'}", "", "## Violations", ""]
    if not fails:
        lines.append("None.")
    for seed, n, vs in fails:
        again = replays.get(f"{seed}:{n}")
        told = "not replayed" if again is None else "violated again" if again else "held on replay (timing)"
        lines.append(f"- seed {seed} round {n} ({told}; replay: `python -m tests.chaos --seed {seed} --round {n}`)")
        lines += [f"    - {v[:400]}" for v in vs]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="how many seeds (consecutive from --first-seed)")
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--kills", type=int, default=50, help="daemon kills per seed")
    ap.add_argument("--max-load", type=float, default=20.0, help="most seconds of load before a kill")
    ap.add_argument("--image-from", type=Path, default=Path("/var/lib/forkd"),
                    help="copy the guest image from this home instead of building one")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "reports",
                    help="directory of the dated report")
    args = ap.parse_args()
    reports = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        reports.append(run(Config(kills=args.kills, seed=seed, max_load=args.max_load, image_from=args.image_from)))
    fails = failing(reports)
    replays = {}
    for seed, n, _ in fails[:REPLAYS_KEPT]:
        again = run(Config(kills=n, seed=seed, max_load=args.max_load, image_from=args.image_from, rounds=(n,)))
        replays[f"{seed}:{n}"] = any(not r.survived for r in again.kills())
    t = totals(reports)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    cmdline = "python3 bench/chaos.py " + " ".join(sys.argv[1:])
    text = markdown(day, t, fails, replays, cmdline)
    (args.out / f"chaos-{day}.md").write_text(text)
    (args.out / f"chaos-{day}.json").write_text(json.dumps(
        {"date": day, "command": cmdline, **t, "replays": replays,
         "violations": [{"seed": s, "round": n, "violations": vs} for s, n, vs in fails]}, indent=2) + "\n")
    print(text)
    return 1 if fails or t["leaked_qemu"] else 0


if __name__ == "__main__":
    sys.exit(main())
