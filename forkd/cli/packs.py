"""`forkd pack|unpack|pull|push` and `forkd hub serve`: move snapshot chains between hosts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from forkd.cli.daemon import backend
from forkd.cli.options import format_or_old_path, old_spelling
from forkd.cli.output import Fmt, Progress, emit, err, out, size

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")
HUB = typer.Option(None, "--hub", envvar="FORKD_HUB", help="hub base URL (default: $FORKD_HUB): http://... or "
                                                              "file:///dir")

hub_app = typer.Typer(help="Serve a directory as a forkd hub.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("pack")(pack_cmd)
    app.command("unpack")(unpack_cmd)
    app.command("pull")(pull_cmd)
    app.command("push")(push_cmd)
    app.add_typer(hub_app, name="hub")
    hub_app.command("serve")(hub_serve)


class _Bar:
    """Download progress on stderr: a rewritten line on a terminal, a line every 10 % otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = -1
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        pct = 100 if not total else min(100, done * 100 // total)
        step = pct if self.tty else pct // 10 * 10
        if step == self.last:
            return
        self.last = step
        rate = done / max(time.monotonic() - self.t0, 1e-6)
        line = f"downloading {size(done)} of {size(total)} ({pct}%, {size(int(rate))}/s)"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if done >= total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _rows(res: dict) -> list[list[str]]:
    return [[res.get("head") or res.get("tag", "-"), " -> ".join(res["chain"]), res["image_id"],
              ", ".join(res.get("installed", [])) or "-", ", ".join(res.get("skipped", [])) or "-",
              f"{res['seconds']:.1f}"]]


COLUMNS = [("HEAD", "left"), ("CHAIN", "left"), ("IMAGE", "left"), ("INSTALLED", "left"), ("ALREADY THERE", "left"),
           ("SECONDS", "right")]


def pack_cmd(tag: str = typer.Option(..., "--tag", "-t", help="chain head to pack (with every ancestor)"),
             output_file: Path | None = typer.Option(None, "--output-file", help="pack file to write (F.tar.zst)"),
             level: int = typer.Option(3, "--level", help="zstandard level (1-19)"),
             output: str | None = typer.Option(None, "-o", "--output", help="output format: table, json or yaml"),
             json_: bool = typer.Option(False, "--json", hidden=True, help="old spelling of -o json")) -> None:
    """Bundle a snapshot, its ancestors and its guest image into one verified .tar.zst."""
    fmt, old_path = format_or_old_path(output, "--output-file")
    if json_:
        old_spelling("--json", "-o json")
        fmt = Fmt.json
    fmt = fmt or Fmt.table
    path = output_file or (Path(old_path) if old_path else None)
    if path is None:
        raise typer.BadParameter("name the pack file to write", param_hint="--output-file")
    res = backend().pack(tag, str(path.resolve()), level=level, progress=Progress(fmt != Fmt.table))
    if fmt != Fmt.table:
        emit(res, fmt)
    else:
        out.print(f"packed {' -> '.join(res['chain'])} + image {res['image_id']} into {res['path']}: "
                  f"{size(res['pack_bytes'])} ({size(res['logical_bytes'])} logical) in {res['seconds']:.1f} s")


def unpack_cmd(file: Path = typer.Argument(..., help="pack file (.tar.zst)"), output: Fmt = OUTPUT) -> None:
    """Verify a pack completely, then install its snapshots and image (atomic, idempotent)."""
    res = backend().unpack(str(file.resolve()), progress=Progress(output != Fmt.table))
    emit(res, output, COLUMNS, _rows(res))


def pull_cmd(ref: str = typer.Argument(..., help="owner/name[@version] (default: the latest)"), hub: str = HUB,
             output: Fmt = OUTPUT) -> None:
    """Download a pack from the hub, verify it against the index, and unpack it."""
    res = backend().pull(ref, hub, progress=Progress(output != Fmt.table), on_bytes=_Bar())
    emit(res, output, COLUMNS, _rows(res))


def push_cmd(ref: str = typer.Argument(..., help="owner/name@version"),
             tag: str = typer.Option(..., "--tag", "-t", help="chain head to push"), hub: str = HUB,
             force: bool = typer.Option(False, "--force", help="replace the version if it is already there"),
             output: Fmt = OUTPUT) -> None:
    """Pack a snapshot chain into a file:// hub and list it in the hub's registry.json."""
    res = backend().push(tag, ref, hub, force=force, progress=Progress(output != Fmt.table))
    emit(res, output, [("NAME", "left"), ("VERSION", "left"), ("CHAIN", "left"), ("SIZE", "right"),
                       ("FILE", "left")],
         [[res["name"], res["version"], " -> ".join(res["chain"]), size(res["bytes"]), res["file"]]])


def hub_serve(directory: Path = typer.Argument(..., help="directory holding registry.json and the packs"),
              port: int = typer.Option(8080, "--port", help="TCP port (0: pick a free one)"),
              bind: str = typer.Option("127.0.0.1", "--bind", help="address to listen on (loopback: default)")) -> None:
    """Serve a directory as a read-only hub over HTTP (for tests and air-gapped sites)."""
    from forkd.client import hub_server

    srv = hub_server(directory, port, bind)
    host, p = srv.server_address[:2]
    if bind not in ("127.0.0.1", "::1", "localhost"):
        err.print(f"[yellow]warning:[/] serving {directory} to the network on {bind} (no authentication)")
    sys.stdout.write(f"serving {Path(directory).resolve()} at http://{host}:{p}/\n")
    sys.stdout.flush()
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
