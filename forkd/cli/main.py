"""`forkd` command line. Each command parses its arguments, calls its verb on `backend()` (forkd.cli.daemon: the
daemon named by FORKD_URL/FORKD_TOKEN or answering on $FORKD_HOME/forkd.sock, else in-process), and prints.

Exit codes: 0 ok; 1 runtime failure; 2 bad input; 3 not found; 4 conflict / not ready; 5 timed out;
6 daemon unavailable (every verb but exec).
`exec` (forkd/cli/streams.py) exits with the guest command's own code, and forkd's own failures move out of its way,
as docker's: 124 timed out, 125 forkd failed, 126 cannot run, 127 not found, 128+N killed by signal N.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from forkd.base.durations import EXAMPLES
from forkd.cli import branch as branch_cli
from forkd.cli import calls, reading
from forkd.cli.daemon import backend
from forkd.cli.options import (
    CHILD,
    OLD_COUNT,
    SNAPSHOT,
    complete_children,
    complete_snapshots,
    count,
    count_option,
    duration_value,
    egress_option,
    old_spelling,
    timeout_option,
)
from forkd.cli.output import Fmt, Progress, emit, ms, out, size
from forkd.cli.tree import app, main  # noqa: F401 - the root (tests, the reference) and `python -m forkd.cli.main`

verbs = typer.Typer()  # this module's verbs; register() adds them to the root (forkd.cli.verbs)
snapshot_app = typer.Typer(help="Snapshots: create, ls, info, diff (a layer), compact, rm, push, pull; or branch a "
                                "running child (--from-sandbox).")
# upstream's spelling: forkd snapshot --from-sandbox ID --tag T [--live|--diff]
snapshot_app.callback(invoke_without_command=True)(branch_cli.snapshot_from_sandbox)

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")
# request field -> the flag a user types for it (errors name the flag, forkd.core.requests.invalid_flags;
# fork's: forkd.cli.calls.SPAWN_FLAGS)
PARENT_FLAGS = {"tag": "--tag", "memory_mib": "--memory-mib", "vcpus": "--vcpus", "warm_imports": "--warm-import",
                "warm_run": "--warm-run", "warm_exec": "--warm-exec", "network": "--network"}
LAYER_FLAGS = {"tag": "--tag", "parent_tag": "--from", "run": "--run", "imports": "--import", "code": "--exec"}


def _exit(code: int) -> None:
    """A body's exit code (forkd.cli.calls), as the command's."""
    if code:
        raise typer.Exit(code)


# -- doctor ---------------------------------------------------------------------------------------
@verbs.command()
def doctor(output: Fmt = OUTPUT,
           reprobe: bool = typer.Option(False, help="probe the accelerator again instead of using the cache")) -> None:
    """Check this host: QEMU, kernel and image, accelerator (real boot probe), userfaultfd, space, cgroups,
    netns. Exits 1 if any check FAILs."""
    checks = backend().doctor(reprobe=reprobe, progress=Progress(quiet=output != Fmt.table))
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}
    emit(checks, output, [("CHECK", "left"), ("STATUS", "left"), ("DETAIL", "left")],
         [[c["name"], f"[{colour[c['status']]}]{c['status']}[/]",
           c["detail"] + (f"\n[dim]fix: {c['fix']}[/]" if c["fix"] else "")] for c in checks])
    if any(c["status"] == "FAIL" for c in checks):
        raise typer.Exit(1)


# -- snapshots ------------------------------------------------------------------------------------
@snapshot_app.command("create")
def snapshot_create(
        tag: str = typer.Option(..., "--tag", "-t", help="name: 1-63 of a-z, 0-9, '.', '_' and '-', starting with a "
                                                        "letter or digit"),
        memory_mib: int = typer.Option(512, "--memory-mib", help="guest RAM in MiB"),
        vcpus: int = typer.Option(1, "--vcpus"),
        warm_import: list[str] = typer.Option([], "--warm-import", help="module to import in the agent (repeat)"),
        warm_run: list[str] = typer.Option([], "--warm-run", help="shell command to run before pausing (repeat)"),
        warm_exec: list[str] = typer.Option([], "--warm-exec",
                                            help="Python code to run in the agent's interpreter (repeat)"),
        network: str = typer.Option("none", "--network",
                                    help="none, or isolated: a NIC, and each child in its own network namespace"),
        output: Fmt = OUTPUT) -> None:
    """Boot a parent VM, warm it up, pause it and write a snapshot children can fork from."""
    from forkd.client import ParentBuild

    req = ParentBuild.of(flags=PARENT_FLAGS, tag=tag, memory_mib=memory_mib, vcpus=vcpus,
                         warm_imports=tuple(warm_import), warm_run=tuple(warm_run), warm_exec=tuple(warm_exec),
                         network=network)
    snap = backend().create_snapshot(req, progress=Progress(quiet=output != Fmt.table))
    t = snap["timings_ms"]
    emit(snap, output, [("TAG", "left"), ("STATUS", "left"), ("BOOT ms", "right"), ("WARM ms", "right"),
                        ("SAVE ms", "right"), ("MEMORY", "right")],
         [[snap["tag"], snap["status"], ms(t.get("boot")), ms(t.get("warmup")), ms(t.get("save")),
           f"{size(snap['memory_stored_bytes'])} of {size(snap['memory_bytes'])}"]])


@snapshot_app.command("ls")
def snapshots(output: Fmt = OUTPUT) -> None:
    """List snapshots."""
    reading.snapshots(output)


@snapshot_app.command("info")
def snapshot_info(tag: str = SNAPSHOT, output: Fmt = OUTPUT) -> None:
    """Show one snapshot: status, sizes, hashes, warm-up, the children using it."""
    calls.snapshot_info(tag, output)


@snapshot_app.command("rm")
def rmi(tag: str = SNAPSHOT,
        force: bool = typer.Option(False, "--force", help="delete even while children of it run (they keep "
                                                          "running) or layers depend on it"),
        force_old: bool = typer.Option(False, "-f", hidden=True, help="old spelling of --force"),
        cascade: bool = typer.Option(False, "--cascade", help="also delete the layers built on it")) -> None:
    """Delete a snapshot. Refused while children of it run or layers depend on it (409-style exit 4)."""
    calls.snapshot_rm(tag, force=force, force_old=force_old, cascade=cascade)


@snapshot_app.command("diff")
def snapshot_diff(tag: str = typer.Option(..., "--tag", "-t", help="name of the new layer"),
                  from_: str = typer.Option(..., "--from", help="snapshot to build on (a base or a layer)"),
                  run: list[str] = typer.Option([], "--run", help="shell command to run (repeat)"),
                  imports: list[str] = typer.Option([], "--import", help="module to import in the agent (repeat)"),
                  code: list[str] = typer.Option([], "--exec", help="Python code to run in the agent (repeat)"),
                  output: Fmt = OUTPUT) -> None:
    """Build a layer: fork one child of --from, run the steps, and store only the pages that changed."""
    from forkd.client import LayerBuild

    req = LayerBuild.of(flags=LAYER_FLAGS, tag=tag, parent_tag=from_, run=tuple(run), imports=tuple(imports),
                        code=tuple(code))
    snap = backend().snapshot_diff(req, progress=Progress(quiet=output != Fmt.table))
    emit(snap, output, [("TAG", "left"), ("FROM", "left"), ("PAGES", "right"), ("STORED", "right"),
                        ("OF", "right"), ("BUILD ms", "right")],
         [[snap["tag"], snap.get("parent_tag") or "-", str(snap.get("diff_pages")), size(snap["memory_stored_bytes"]),
           size(snap["memory_bytes"]), ms(sum(snap["timings_ms"].values()))]])


@snapshot_app.command("compact")
def snapshot_compact(from_: str = typer.Option(..., "--from", help="chain head to compact"),
                     to: str = typer.Option(..., "--to", help="tag of the new base snapshot"),
                     output: Fmt = OUTPUT) -> None:
    """Write a chain head as a base snapshot (flat memory + device state, no ancestors)."""
    from forkd.client import Compaction

    req = Compaction.of(flags={"from_tag": "--from", "to_tag": "--to"}, from_tag=from_, to_tag=to)
    snap = backend().compact(req, progress=Progress(quiet=output != Fmt.table))
    emit(snap, output, [("TAG", "left"), ("FROM", "left"), ("STORED", "right")],
         [[snap["tag"], from_, size(snap["memory_stored_bytes"])]])


# -- children -------------------------------------------------------------------------------------
@verbs.command()
def fork(tag: str | None = typer.Option(None, "--tag", "-t", help="snapshot to fork from (with --from-sandbox: "
                                      "name the branch snapshot, which is then kept)",
                                 autocompletion=complete_snapshots),
         from_sandbox: str | None = typer.Option(None, "--from-sandbox", help="fork this running child as it is "
                                                 "now: a live branch of it, then N children of that",
                                                 autocompletion=complete_children),
         keep: bool = typer.Option(False, "--keep", help="with --from-sandbox: keep the branch snapshot after the "
                                   "last of its children is killed"),
         n: int = count_option(1, "number of children (1..1000)"),
         n_old: int | None = OLD_COUNT,
         timeout: str = timeout_option("60s", "how long to wait for each child to answer"),
         per_child_netns: bool = typer.Option(False, "--per-child-netns",
                                              help="require network isolation (the snapshot must have a NIC)"),
         memory_limit_mib: int | None = typer.Option(None, "--memory-limit-mib", help="cgroup memory limit"),
         egress: list[str] | None = egress_option(),
         allow_unconstrained: bool = typer.Option(False, "--allow-unconstrained",
                                                  help="start children even where no cgroup can constrain them"),
         prime: list[str] = typer.Option([], "--prime", help="shell command each child runs once before it counts "
                                         "as answering (repeat); `--prime true` makes its first exec ~40 ms "
                                         "instead of ~250 ms under TCG, for ~14 MiB more memory per child"),
         output: Fmt = OUTPUT) -> None:
    """Fork N children of a snapshot (--tag), or of a running child as it is now (--from-sandbox ID); returns when
    every child answered. Children outlive this command; through the daemon they live FORKD_SANDBOX_TIMEOUT."""
    _exit(calls.fork(tag, from_sandbox, keep, n, n_old, timeout, per_child_netns, memory_limit_mib, egress,
                     allow_unconstrained, prime, output))


@verbs.command("set-timeout")
def set_timeout(child: str = typer.Argument(..., help="id of a running child"),
                seconds: str = typer.Argument(..., metavar="DURATION", callback=duration_value,
                                                help=f"it now expires this long from now ({EXAMPLES})"),
                output: Fmt = OUTPUT) -> None:
    """Keepalive: a child made through the daemon expires DURATION from now (the daemon kills it then)."""
    rec = backend().set_timeout(child, seconds)
    emit(rec, output, [("ID", "left"), ("EXPIRES AT", "left")],
         [[rec["id"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec["expires_at"]))]])


@verbs.command("port")
def port_(child: str = CHILD, port: int = typer.Argument(..., min=1, max=65535, help="a TCP port the guest listens on"),
          close: bool = typer.Option(False, "--close", help="revoke every URL of PORT: they stop working"),
          output: Fmt = OUTPUT) -> None:
    """Open TCP PORT of CHILD through the daemon: prints a URL (a path under the daemon's address over the unix
    socket) that reaches the guest's HTTP server on PORT, for whoever holds it, until --close or the child dies.
    Each run opens a new URL (its token is shown this once: the daemon keeps a hash). Needs the daemon; any
    child, with a NIC or not, on any egress."""
    res = backend().port(child, port, close=close)
    if close:
        emit(res, output, [("ID", "left"), ("PORT", "right"), ("CLOSED", "left")], [[child, str(port), "yes"]])
        return
    emit(res, output, [("ID", "left"), ("PORT", "right"), ("URL", "left")],
         [[child, str(port), res.get("url") or res["path"]]])


@verbs.command("gc")
def gc(dry_run: bool = typer.Option(False, "--dry-run", help="report what would be removed, remove nothing"),
       grace: float = typer.Option(60.0, help="seconds an unrecorded object may be a spawn still in progress"),
       output: Fmt = OUTPUT) -> None:
    """Adopt live children; remove dead ones and orphaned namespaces, veths, taps, cgroups, sockets, memory
    files and VMM processes (identified by recorded pid + start time, or by our naming, never by process name)."""
    calls.gc(dry_run, grace, output)


@verbs.command("ls")
def ls(label: list[str] | None = typer.Option(None, "--label", "-l", help="only children with label k=v (or "
                                              "key k); repeat to AND them"),
       output: Fmt = OUTPUT) -> None:
    """List children (running, dead = its VMM is gone, failed)."""
    reading.children(label, output)


@verbs.command("eval")
def eval_(child: str = CHILD, code: str = typer.Argument(..., help="Python expression or statements"),
          output: Fmt = OUTPUT,
          timeout: str = timeout_option("60s", "how long to wait for the answer")) -> None:
    """Evaluate a Python expression in the child's warm interpreter and print its repr."""
    _exit(calls.eval_(child, code, output, timeout))


@verbs.command()
def ping(child: str = CHILD) -> None:
    """Check that a child's agent answers."""
    calls.ping(child)


@verbs.command()
def kill(ids: list[str] = typer.Argument(None, help="child ids"),
         all_: bool = typer.Option(False, "--all", help="kill every child"),
         tag: str | None = typer.Option(None, "--tag", help="kill the children of this snapshot")) -> None:
    """Stop children and remove their records (dead ones too)."""
    calls.kill(ids, all_=all_, tag=tag)


@verbs.command()
def quickstart(spec: Path = typer.Option(Path("specs/examples/pool.yaml"), "-f", "--filename",
                                         help="spec with a parent and a pool"),
               n: int = count_option(4, "children to claim"),
               n_old: int | None = OLD_COUNT,
               keep: bool = typer.Option(False, help="leave the claimed children running"),
               output: Fmt = OUTPUT) -> None:
    """The whole tour: apply a parent + pool spec, wait until the pool is warm, claim N children, and run an
    eval and an exec in each."""
    from forkd.client.quickstart import run_quickstart

    result = run_quickstart(backend(), spec, count(n, n_old), keep, progress=Progress(quiet=output != Fmt.table))
    emit(result, output, [("CHILD", "left"), ("EVAL ms", "right"), ("EVAL", "left"), ("EXEC ms", "right"),
                          ("EXEC stdout", "left")],
         [[c["id"], ms(c["eval_ms"]), c["eval"], ms(c["exec_ms"]), c["exec_stdout"]] for c in result["children"]])
    if output == Fmt.table:
        out.print(f"pool '{result['pool']}' Ready after {result['ready_s']:.1f} s; {len(result['children'])} "
                  f"children claimed in {result['claim_ms']:.1f} ms"
                  + ("" if keep else " (and killed again)"))


@verbs.command()
def serve(watch: Path | None = typer.Option(None, help="apply this directory on every change (GitOps), "
                                                            "pruning objects removed from it"),
          interval: float = typer.Option(2.0, help="seconds between reconcile passes when nothing changes"),
          bind: str | None = typer.Option(None, "--bind", help="also serve the API on TCP HOST:PORT (default port "
                                                               "8889); needs --token-file"),
          token_file: Path | None = typer.Option(None, "--token-file", help="bearer token file for TCP (0600; "
                                                                             "created if missing)"),
          tls_cert: Path | None = typer.Option(None, "--tls-cert", help="serve TCP over TLS: PEM certificate"),
          tls_key: Path | None = typer.Option(None, "--tls-key", help="the PEM key of --tls-cert (0600)"),
          allow_host: list[str] = typer.Option([], "--allow-host", help="a Host name TCP clients may use besides "
                                                                        "the bound address (repeatable)")) -> None:
    """Run the daemon: the reconcile loop, the API on $FORKD_HOME/forkd.sock, and the children it owns.
    While it runs, every forkd command on this host goes through it (elsewhere: set FORKD_URL and FORKD_TOKEN)."""
    argv = [sys.executable, "-m", "forkd.api", "serve", "--interval", str(interval)]
    if bind is not None:
        argv += ["--bind", bind]
    if token_file is not None:
        argv += ["--token-file", str(token_file.resolve())]
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None:
            argv += [flag, str(path.resolve())]
    for name in allow_host:
        argv += ["--allow-host", name]
    if watch is not None:
        if not watch.is_dir():
            raise typer.BadParameter(f"{watch} is not a directory")
        argv += ["--watch", str(watch.resolve())]
    os.execv(sys.executable, argv)


audit_app = typer.Typer(help="The daemon's hash-chained audit log ($FORKD_HOME/audit.log).", no_args_is_help=True)


@audit_app.command("verify")
def audit_verify() -> None:
    """Check the audit log's hash chain: prints OK, or the first bad line and exits 1."""
    _exit(calls.audit_verify())


def _old_noun(old: str, new: str, command: Any) -> Any:
    """`command` under its old top-level name: hidden from --help, warning that `forkd snapshot NEW` is the spelling."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        old_spelling(f"forkd {old}", f"forkd snapshot {new}")
        return command(*args, **kwargs)

    return run


def register(root: typer.Typer) -> None:
    """Add this module's verbs and groups to the root, and the snapshot verbs' old spellings (OLD_NOUNS), hidden."""
    from forkd.cli import distribute
    from forkd.cli.verbs import OLD_NOUNS

    root.registered_commands += verbs.registered_commands
    nouns = {info.name: info.callback for info in snapshot_app.registered_commands}
    for old, (module, new) in OLD_NOUNS.items():
        if module == "main":
            root.command(old, hidden=True, help=nouns[new].__doc__)(_old_noun(old, new, nouns[new]))
    distribute.register(snapshot_app)
    root.add_typer(snapshot_app, name="snapshot")
    root.add_typer(audit_app, name="audit")


if __name__ == "__main__":
    main()
