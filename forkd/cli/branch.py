"""`forkd branch ID --tag T [--mode live|diff|full] [--no-wait]`: snapshot a running child."""

from __future__ import annotations

import sys
from enum import StrEnum

import typer

from forkd.cli.daemon import backend
from forkd.cli.options import complete_children
from forkd.cli.output import Fmt, emit, err, ms, out

OUTPUT_HELP = "table, json or yaml"


class Mode(StrEnum):
    live = "live"
    diff = "diff"
    full = "full"


def register(app: typer.Typer) -> None:
    app.command("branch")(branch_cmd)


def snapshot_from_sandbox(ctx: typer.Context,
                          from_sandbox: str | None = typer.Option(None, "--from-sandbox",
                                                                  help="branch this running child (as 'forkd "
                                                                       "branch ID')"),
                          tag: str | None = typer.Option(None, "--tag", "-t", help="with --from-sandbox: the "
                                                         "new snapshot's name"),
                          mode: Mode = typer.Option(Mode.live, "--mode", help="with --from-sandbox: live, diff "
                                                    "or full"),
                          live: bool = typer.Option(False, "--live", help="same as --mode live"),
                          diff: bool = typer.Option(False, "--diff", help="same as --mode diff"),
                          no_wait: bool = typer.Option(False, "--no-wait", help="with --from-sandbox: return "
                                                       "once the child runs again"),
                          output: Fmt = typer.Option(Fmt.table, "-o", "--output", help=OUTPUT_HELP)) -> None:
    """Create warm snapshots ('create'), or branch a running child with --from-sandbox ID --tag T."""
    if ctx.invoked_subcommand is not None:
        return
    if from_sandbox is None or tag is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0 if from_sandbox is None and tag is None else 2)
    chosen = Mode.diff if diff else Mode.live if live else mode
    branch_cmd(from_sandbox, tag, chosen, no_wait, output)


def branch_cmd(child: str = typer.Argument(..., help="id of the running child to snapshot",
                                          autocompletion=complete_children),
               tag: str = typer.Option(..., "--tag", "-t", help="name of the new snapshot"),
               mode: Mode = typer.Option(Mode.live, "--mode", help="live: a self-contained snapshot, the child "
                                         "stopped a few ms while the pages it wrote are taken (by pages) or, when "
                                         "it wrote more than 1/40 of its RAM, has a disk or its agent is held, "
                                         "while QEMU write-protects all of its RAM (longer as RAM grows; "
                                         "FORKD_BRANCH_LIVE_CAPTURE); diff: it stops only while its device "
                                         "state and the pages it wrote are taken (a few ms), and the snapshot is a "
                                         "layer over the child's own; full: it stops while all of its RAM is "
                                         "saved"),
               no_wait: bool = typer.Option(False, "--no-wait", help="return once the child runs again; the "
                                            "snapshot stays 'writing' until converted"),
               output: Fmt = typer.Option(Fmt.table, "-o", "--output", help=OUTPUT_HELP)) -> None:
    """Snapshot a running child into a forkable snapshot ('forkd fork --tag T' restores its state).

    With --no-wait this command returns as soon as the child runs again and prints the 'writing' snapshot; the
    conversion continues in this process, which exits only once the snapshot is ready or failed (a daemon
    returns at once)."""
    b = backend()
    from forkd.client import Branch

    req = Branch.of(flags={"child_id": "CHILD", "tag": "--tag", "mode": "--mode"}, child_id=child, tag=tag,
                    mode=mode.value, wait=not no_wait)
    res = b.branch(req)
    snap = res["snapshot"]
    emit(res, output, [("TAG", "left"), ("STATUS", "left"), ("MODE", "left"), ("CAPTURE", "left"), ("SOURCE", "left"),
                       ("PAUSE ms", "right"), ("RETURNED ms", "right")],
         [[snap["tag"], snap["status"], res["mode"], res.get("capture") or "-", res["source"], ms(res["pause_ms"]),
           ms(res["returned_ms"])]])
    if res.get("capture_note") and output == Fmt.table:
        err.print(f"[dim]captured by {res.get('capture')}, not by pages: {res['capture_note']}[/]")
    if no_wait:
        sys.stdout.flush()
        if output == Fmt.table:
            err.print("[dim]source running again; converting in the background[/]")
        # in-process, the conversion runs in a thread of this process: settle() waits for it (a daemon: None)
        done = b.settle(tag)
        if done is not None and output == Fmt.table:
            out.print(f"{tag}: {done['status']}" + (f" ({done['error']})" if done.get("error") else ""))
