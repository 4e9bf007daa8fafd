"""`forkd cp SRC DST`: copy files and directories between a sandbox and this host (like `docker cp`)."""

from __future__ import annotations

import typer

from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, emit, err, size

HELP = """Copy files or directories between a sandbox and this host, as a tar stream (like docker cp).

One side is ID:/path in a sandbox, the other a host path, or '-' for a tar stream on stdin/stdout:

  forkd cp ID:/etc/hosts ./hosts        a file out of the sandbox
  forkd cp ID:/root/project ./out       a directory (./out is created, or the directory lands inside it if it exists)
  forkd cp ./data ID:/root/             into the sandbox
  forkd cp ID:/var/log - | tar t        a tar stream on stdout
  tar c dir | forkd cp - ID:/root/      a tar stream from stdin, extracted into /root

Archives from the sandbox are untrusted: they must hold exactly the entry asked for (every member beneath the
path's last component) or the copy fails and writes nothing; entries that climb out (../, absolute names) fail the
copy; the archive is unpacked aside and moved into place only when whole; links are recreated as links and never
followed, hard links and devices are skipped, and at most --max-size bytes are written.
Exit codes: 0 ok, 2 bad input or a refused archive, 3 not found."""


def cp(src: str = typer.Argument(..., help="ID:/path, a host path, or - (a tar stream on stdin)"),
       dst: str = typer.Argument(..., help="ID:/path, a host path, or - (a tar stream on stdout)"),
       max_size: int = typer.Option(64 << 30, "--max-size", help="most bytes a copy out of a sandbox may write "
                                                                 "(default 64 GiB)"),
       output: Fmt = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml"),
       quiet: bool = typer.Option(False, "-q", "--quiet", help="print nothing on success")) -> None:
    from forkd.client.copy import copy

    res = copy(backend(), src, dst, max_bytes=max_size)
    if quiet or dst == "-":
        if dst == "-" and not quiet:
            err.print(f"{res['from']}: {size(res['bytes'])} of tar written to stdout")
        return
    skipped = res.get("skipped_count", 0)
    emit(res, output, [("FROM", "left"), ("TO", "left"), ("BYTES", "right"), ("SKIPPED", "right")],
         [[res["from"], res["to"], size(res["bytes"]), str(skipped)]])


def register(app: typer.Typer) -> None:
    app.command("cp", help=HELP)(cp)
