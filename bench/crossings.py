#!/usr/bin/env python3
"""The forkd source files one CLI command runs code of: how many files a request crosses on its way down.

    python3 bench/crossings.py [--root DIR] [-o json] -- VERB [ARGS...]

Runs `forkd VERB ARGS...` in this interpreter (the installed entry point, `forkd.cli.fast:main` in older
releases) with a profiler (every thread) that records each function entered whose file is under `--root`
(default: the forkd package this interpreter imports), then prints the count per package and the files. Code run
by an import (a module's body, and what it calls) is not counted: only functions the command itself called.
Run it against a home made for it (FORKD_HOME), in-process (FORKD_NO_DAEMON=1), so the daemon's side is traced too.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from pathlib import Path


def entry_point():
    """The `forkd` console script's function: forkd.cli.main in this release, forkd.cli.fast.main before."""
    try:
        from forkd.cli.fast import main as fast  # older releases
        return fast
    except ImportError:
        from forkd.cli import main
        return main


def trace(argv: list[str], root: Path) -> tuple[int, set[str]]:
    """Run the CLI with `argv`; (its exit code, the files under `root` whose functions it called)."""
    seen: set[str] = set()
    prefix = str(root) + "/"
    top = sys._getframe()  # the walk up a stack stops here: what called trace() is not the command

    def profile(frame, event, _arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(prefix) or name[len(prefix):] in seen:
            return
        f = frame
        while f is not None and f is not top:  # inside an import: not the command's own work
            if f.f_code.co_name == "<module>":
                return
            f = f.f_back
        seen.add(name[len(prefix):])

    main = entry_point()

    sys.argv = ["forkd", *argv]
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return code, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=None, help="count files under this directory (default: forkd's)")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    import forkd

    root = (args.root or Path(forkd.__file__).resolve().parent).resolve()
    code, files = trace(argv, root)
    per = Counter(f.split("/")[0] if "/" in f else "(top)" for f in files)
    if args.output == "json":
        print(json.dumps({"argv": argv, "exit": code, "files": len(files), "per_package": dict(sorted(per.items())),
                          "list": sorted(files)}, indent=2), file=sys.__stdout__)
    else:
        print(f"forkd {' '.join(argv)}: exit {code}, {len(files)} files", file=sys.__stderr__)
        for pkg, n in sorted(per.items()):
            print(f"  {pkg:12s} {n}", file=sys.__stderr__)
    sys.exit(code)


if __name__ == "__main__":
    main()
