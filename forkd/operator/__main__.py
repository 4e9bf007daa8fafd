"""Entry point of the operator process (what `forkd operator` and `forkd crds` exec):

    python -m forkd.operator run [-n NAMESPACE ...] [--liveness URL] [--verbose]
                                 [--log-level LEVEL] [--log-format text|json]
    python -m forkd.operator crds [-o DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from forkd.base.atomic import write_bytes
from forkd.base.logs import FORMATS, LEVELS


def write_crds(directory: Path | None) -> list[Path]:
    from forkd.operator.crdgen import files, rendered

    if directory is None:
        sys.stdout.write("---\n".join(rendered().values()))
        return []
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in files().items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            write_bytes(path, text.encode())
        out.append(path)
    return out


def run(namespaces: list[str], liveness: str | None, verbose: bool, log_level: str | None = None,
        log_format: str | None = None) -> None:
    import logging
    import os

    import kopf

    from forkd.base.logs import setup
    from forkd.operator import handlers

    # forkd's set-up, not kopf.configure (which adds a second handler of its own to the root logger)
    setup("DEBUG" if verbose else log_level, log_format, default_level="INFO")
    logging.getLogger("asyncio").setLevel(logging.WARNING)  # kopf keeps asyncio's chatter out too
    sock = handlers.daemon_socket()
    from forkd.base.settings import settings

    listed = settings().nodes.strip() or settings().node_pods.strip()
    if not listed and not os.path.exists(sock):
        logging.getLogger("forkd.operator").warning("no node daemon socket at %s yet (FORKD_DAEMON_SOCKET); "
                                                    "handlers retry until it answers", sock)
    handlers.register()
    kopf.run(clusterwide=not namespaces, namespaces=namespaces, standalone=True, liveness_endpoint=liveness)


def main() -> None:
    ap = argparse.ArgumentParser(prog="forkd operator")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the kopf operator")
    r.add_argument("-n", "--namespace", action="append", default=[],
                   help="watch this namespace (repeatable; default: all namespaces)")
    r.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    r.add_argument("--verbose", action="store_true", help="log at DEBUG")
    r.add_argument("--log-level", choices=LEVELS, type=str.upper, help="default: $FORKD_LOG_LEVEL, else INFO")
    r.add_argument("--log-format", choices=FORMATS, help="text or json (one object per line); "
                                                         "default: $FORKD_LOG_FORMAT, else text")
    c = sub.add_parser("crds", help="write (or print) the CustomResourceDefinitions")
    c.add_argument("-o", "--output-dir", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "crds":
        for path in write_crds(args.output_dir):
            print(path)
    else:
        run(args.namespace, args.liveness, args.verbose, args.log_level, args.log_format)


if __name__ == "__main__":
    main()
