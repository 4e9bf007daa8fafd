"""Entry point of the daemon process:
`python -m forkd.api serve [--watch DIR] [--interval S] [--bind HOST:PORT --token-file PATH [--tls-cert PEM
--tls-key PEM] [--allow-host NAME]...] [--log-level LEVEL] [--log-format text|json]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from forkd.api.daemon import serve
from forkd.base.errors import ForkdError
from forkd.base.logs import FORMATS, LEVELS, setup
from forkd.base.paths import Layout


def main() -> None:
    ap = argparse.ArgumentParser(prog="forkd serve")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--watch", type=Path)
    s.add_argument("--interval", type=float, default=2.0)
    s.add_argument("--bind", help="also listen on TCP HOST[:PORT] (port 8889 by default); needs --token-file")
    s.add_argument("--token-file", type=Path, help="bearer token for TCP (base64 of 32 random bytes, 0600; "
                                                   "created if missing)")
    s.add_argument("--tls-cert", type=Path, help="serve TCP over TLS with this PEM certificate (chain)")
    s.add_argument("--tls-key", type=Path, help="the PEM key of --tls-cert (0600)")
    s.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name TCP clients may use besides the bound address (repeatable)")
    s.add_argument("--log-level", choices=LEVELS, type=str.upper, help="default: $FORKD_LOG_LEVEL, else INFO")
    s.add_argument("--log-format", choices=FORMATS, help="text or json (one object per line); "
                                                         "default: $FORKD_LOG_FORMAT, else text")
    args = ap.parse_args()
    try:
        setup(args.log_level, args.log_format, default_level="INFO")
        serve(Layout.from_env(), watch=args.watch, interval=args.interval, bind=args.bind,
              token_file=args.token_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
              allow_hosts=tuple(args.allow_host))
    except ForkdError as exc:
        print(f"forkd serve: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
