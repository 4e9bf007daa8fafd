"""python -m tests.chaos [--kills 50] [--seed 7] [--round N] [--image-from HOME] [--no-isolated] [-o json]

Start a daemon on a private $FORKD_HOME, drive a mixed load through the CLI and kill -9 the daemon (and some CLI
processes) --kills times at seeded random points; after each restart check every invariant (tests/chaos/
invariants.py). Prints the kills survived, the time to recover (p50/p90) and every violation with its seed and
round. Exits 1 if any invariant failed. The home is deleted at the end (its daemon log is kept beside it).
`--round N` replays round N of the seed alone on a fresh home (a round's operations and kill point depend on the
seed and N only; what the VMs do meanwhile is timing). Many seeds with a dated report: bench/chaos.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tests.chaos.harness import Config, run


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=50, help="daemon kills (rounds)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--round", type=int, action="append", default=[], dest="rounds",
                    help="replay only this round of the seed (repeatable)")
    ap.add_argument("--min-load", type=float, default=2.0, help="least seconds of load before a kill")
    ap.add_argument("--max-load", type=float, default=20.0, help="most seconds of load before a kill")
    ap.add_argument("--workers", type=int, default=2, help="concurrent load threads")
    ap.add_argument("--no-isolated", action="store_true", help="leave out the pool of isolated children")
    ap.add_argument("--home", type=Path, help="the private FORKD_HOME to create (default: a new /tmp/fkc*)")
    ap.add_argument("--image-from", type=Path, default=Path(os.environ.get("FORKD_HOME", "/var/lib/forkd")),
                    help="copy the guest image from this home instead of building one (default: $FORKD_HOME)")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    cfg = Config(kills=args.kills, seed=args.seed, min_load=args.min_load, max_load=args.max_load,
                 workers=args.workers, isolated=not args.no_isolated, home=args.home, image_from=args.image_from,
                 rounds=tuple(args.rounds))
    report = run(cfg)
    if args.output == "json":
        print(json.dumps({"seed": report.seed, "kills": len(report.kills()),
                          "survived": sum(r.survived for r in report.kills()),
                          "recover_s": report.recover_pct(), "setup_s": report.setup_s,
                          "rounds": [vars(r) for r in report.rounds], "errors": report.errors,
                          "leaked_qemu": report.leaked_qemu}, indent=2, default=str))
    else:
        print(report.summary())
    failed = any(r.violations.get(c) for r in report.rounds for c in r.violations) or report.leaked_qemu
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
