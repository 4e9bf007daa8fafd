"""Entry point of the daemon process: `python -m forkd.api serve [--watch DIR] [--interval S]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from forkd.api.daemon import serve
from forkd.base.paths import Layout


def main() -> None:
    ap = argparse.ArgumentParser(prog="forkd serve")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--watch", type=Path)
    s.add_argument("--interval", type=float, default=2.0)
    args = ap.parse_args()
    serve(Layout.from_env(), watch=args.watch, interval=args.interval)


if __name__ == "__main__":
    main()
