"""Entry point of the operator process (what `forkd operator` and `forkd crds` exec):

    python -m forkd.operator run [-n NAMESPACE ...] [--liveness URL] [--verbose]
    python -m forkd.operator crds [-o DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
            path.write_text(text)
        out.append(path)
    return out


def run(namespaces: list[str], liveness: str | None, verbose: bool) -> None:
    import logging
    import os

    import kopf

    from forkd.operator import handlers

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sock = handlers.daemon_socket()
    if not os.path.exists(sock):
        logging.getLogger("forkd.operator").warning("no node daemon socket at %s yet (FORKD_DAEMON_SOCKET); "
                                                    "handlers retry until it answers", sock)
    kopf.configure(verbose=verbose)
    handlers.register()
    kopf.run(clusterwide=not namespaces, namespaces=namespaces, standalone=True, liveness_endpoint=liveness)


def main() -> None:
    ap = argparse.ArgumentParser(prog="forkd operator")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the kopf operator")
    r.add_argument("-n", "--namespace", action="append", default=[],
                   help="watch this namespace (repeatable; default: all namespaces)")
    r.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    r.add_argument("--verbose", action="store_true")
    c = sub.add_parser("crds", help="write (or print) the CustomResourceDefinitions")
    c.add_argument("-o", "--output-dir", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "crds":
        for path in write_crds(args.output_dir):
            print(path)
    else:
        run(args.namespace, args.liveness, args.verbose)


if __name__ == "__main__":
    main()
