"""What every benchmark's `main` does around its run: SIGTERM and SIGHUP unwind like Ctrl-C (so the `finally` blocks
stop every child it started), a ForkdError is one line and exit 1, an interrupt exit 130, the JSON report goes to
`--report`, and the table (or JSON with `-o json`) to stdout."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from forkd.base.errors import ForkdError


def unwind_on_signals() -> None:
    def _raise(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


def run_main(args: argparse.Namespace, run: Callable[[argparse.Namespace], dict],
             table: Callable[[dict], str]) -> int:
    unwind_on_signals()
    try:
        result = run(args)
    except ForkdError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench interrupted; the children it started were stopped", file=sys.stderr)
        return 130
    if args.report:
        Path(args.report).write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, indent=2, sort_keys=True) if args.output == "json" else table(result))
    return 0
