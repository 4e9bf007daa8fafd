"""`forkd` command line. Each command parses its arguments, calls forkd.core, and prints.

Exit codes: 0 ok; 1 runtime failure; 2 bad input; 3 not found; 4 conflict / not ready;
`exec` exits with the guest command's own exit code (124 when it timed out).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer
from rich.markup import escape

from forkd import __version__
from forkd.base.errors import ForkdError
from forkd.cli import branch as branch_cli
from forkd.cli import declarative, k8s
from forkd.cli import images as images_cli
from forkd.cli import packs as packs_cli
from forkd.cli.output import Fmt, Progress, emit, err, ms, out, size
from forkd.core.requests import Compaction, LayerBuild, ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.store.snapshot import CorruptManifest

app = typer.Typer(
    help="forkd: copy-on-write microVM sandboxes. Boot a parent once, snapshot it warm, fork children in "
         "milliseconds.\n\nState lives in $FORKD_HOME (default /var/lib/forkd).",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]})
image_app = typer.Typer(help="Guest images (kernel + initramfs with Python and the forkd agent).",
                        no_args_is_help=True)
snapshot_app = typer.Typer(help="Create warm snapshots, or branch a running child (--from-sandbox).")
app.add_typer(image_app, name="image")
app.add_typer(snapshot_app, name="snapshot")

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")


def rt() -> Runtime:
    return Runtime()


@app.command()
def version() -> None:
    """Print forkd's version."""
    out.print(__version__)


# -- doctor ---------------------------------------------------------------------------------------
@app.command()
def doctor(output: Fmt = OUTPUT,
           reprobe: bool = typer.Option(False, help="probe the accelerator again instead of using the cache")) -> None:
    """Check this host: QEMU, kernel and image, accelerator (real boot probe), userfaultfd, space, cgroups,
    netns. Exits 1 if any check FAILs."""
    from forkd.core.doctor import run_checks

    checks = run_checks(rt(), reprobe=reprobe, progress=Progress(quiet=output != Fmt.table))
    data = [c.__dict__ for c in checks]
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}
    emit(data, output, [("CHECK", "left"), ("STATUS", "left"), ("DETAIL", "left")],
         [[c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail + (f"\n[dim]fix: {c.fix}[/]" if c.fix else "")]
          for c in checks])
    if any(c.status == "FAIL" for c in checks):
        raise typer.Exit(1)


# -- images ---------------------------------------------------------------------------------------
@image_app.command("build")
def image_build(force: bool = typer.Option(False, help="rebuild even if the cached image is current"),
                debian_packages: list[str] = typer.Option([], "--debian-packages", help="instead of the default "
                                                          "image: a Debian rootfs with python3 + these packages "
                                                          "(mmdebstrap; repeat or comma-separate)"),
                suite: str = typer.Option("bookworm", "--suite", help="Debian suite for --debian-packages"),
                rootfs: images_cli.RootfsKind = typer.Option(images_cli.RootfsKind.auto, "--rootfs",
                                                             help="with --debian-packages: " + images_cli.ROOTFS_HELP),
                output: Fmt = OUTPUT) -> None:
    """Build the default guest image from Debian packages (cached by content; rebuilt only on change)."""
    if debian_packages:
        return images_cli.debian_build(debian_packages, suite, force, output, rootfs.value)
    image, built = rt().build_image(Progress(quiet=output != Fmt.table), force=force)
    data = dict(image.meta, built_now=built, path=str(image.dir))
    emit(data, output, [("IMAGE", "left"), ("STATE", "left"), ("INITRD", "right"), ("PATH", "left")],
         [[image.id, "built" if built else "cached", size(image.meta.get("initrd_bytes")), str(image.dir)]])


# -- snapshots ------------------------------------------------------------------------------------
@snapshot_app.command("create")
def snapshot_create(
        tag: str = typer.Option(..., "--tag", "-t", help="name: [a-z0-9][a-z0-9._-]{0,62}"),
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
    snap = rt().create_snapshot(ParentBuild.of(tag=tag, memory_mib=memory_mib, vcpus=vcpus,
                                               warm_imports=tuple(warm_import), warm_run=tuple(warm_run),
                                               warm_exec=tuple(warm_exec), network=network),
                                progress=Progress(quiet=output != Fmt.table))
    t = snap.timings_ms
    emit(snap.to_json(), output, [("TAG", "left"), ("STATUS", "left"), ("BOOT ms", "right"), ("WARM ms", "right"),
                                  ("SAVE ms", "right"), ("MEMORY", "right")],
         [[snap.tag, snap.status, ms(t.get("boot")), ms(t.get("warmup")), ms(t.get("save")),
           f"{size(snap.memory_stored_bytes)} of {size(snap.memory_bytes)}"]])


@app.command()
def snapshots(output: Fmt = OUTPUT) -> None:
    """List snapshots."""
    items = rt().snapshots()
    data, rows = [], []
    for s in items:
        if isinstance(s, CorruptManifest):
            data.append({"error": s.message})
            rows.append(["?", "corrupt", "-", "-", "-", "-", s.message])
            continue
        data.append(s.to_json())
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at))
        rows.append([s.tag, s.status, str(s.memory_mib), s.accel, size(s.memory_stored_bytes),
                     size(s.disk_bytes) if s.has_disk else "-", created + (f"  {s.error}" if s.error else "")])
    emit(data, output, [("TAG", "left"), ("STATUS", "left"), ("MiB", "right"), ("ACCEL", "left"),
                        ("STORED", "right"), ("DISK", "right"), ("CREATED", "left")], rows)


@app.command("snapshot-info")
def snapshot_info(tag: str, output: Fmt = OUTPUT) -> None:
    """Show one snapshot: status, sizes, hashes, warm-up, the children using it."""
    info = rt().snapshot_info(tag)
    keys = ["tag", "status", "error", "path", "depth", "ancestors", "dependents", "materialized", "chain_error",
            "parent_tag", "diff_pages", "memory_mib", "vcpus", "accel", "image_id", "qemu_version",
            "warm_imports", "warm_exec", "warm_run", "logical_bytes", "stored_bytes", "memory_sha256", "disk_sha256",
            "disk_bytes", "children", "timings_ms"]
    emit(info, output, [("FIELD", "left"), ("VALUE", "left")], [[k, str(info.get(k))] for k in keys])


@app.command()
def rmi(tag: str,
        force: bool = typer.Option(False, "--force", "-f", help="delete even while children of it run (they keep "
                                                                 "running) or layers depend on it"),
        cascade: bool = typer.Option(False, "--cascade", help="also delete the layers built on it")) -> None:
    """Delete a snapshot. Refused while children of it run or layers depend on it (409-style exit 4)."""
    for t in rt().rmi(tag, force=force, cascade=cascade):
        out.print(f"deleted {t}")


@app.command("snapshot-diff")
def snapshot_diff(tag: str = typer.Option(..., "--tag", "-t", help="name of the new layer"),
                  from_: str = typer.Option(..., "--from", help="snapshot to build on (a base or a layer)"),
                  run: list[str] = typer.Option([], "--run", help="shell command to run (repeat)"),
                  imports: list[str] = typer.Option([], "--import", help="module to import in the agent (repeat)"),
                  code: list[str] = typer.Option([], "--exec", help="Python code to run in the agent (repeat)"),
                  output: Fmt = OUTPUT) -> None:
    """Build a layer: fork one child of --from, run the steps, and store only the pages that changed."""
    snap = rt().snapshot_diff(LayerBuild.of(tag=tag, parent_tag=from_, run=tuple(run), imports=tuple(imports),
                                            code=tuple(code)), progress=Progress(quiet=output != Fmt.table))
    emit(snap.to_json(), output, [("TAG", "left"), ("FROM", "left"), ("PAGES", "right"), ("STORED", "right"),
                                  ("OF", "right"), ("BUILD ms", "right")],
         [[snap.tag, snap.parent_tag or "-", str(snap.diff_pages), size(snap.memory_stored_bytes),
           size(snap.memory_bytes), ms(sum(snap.timings_ms.values()))]])


@app.command("snapshot-compact")
def snapshot_compact(from_: str = typer.Option(..., "--from", help="chain head to compact"),
                     to: str = typer.Option(..., "--to", help="tag of the new base snapshot"),
                     output: Fmt = OUTPUT) -> None:
    """Write a chain head as a base snapshot (flat memory + device state, no ancestors)."""
    snap = rt().compact(Compaction.of(from_tag=from_, to_tag=to), progress=Progress(quiet=output != Fmt.table))
    emit(snap.to_json(), output, [("TAG", "left"), ("FROM", "left"), ("STORED", "right")],
         [[snap.tag, from_, size(snap.memory_stored_bytes)]])


# -- children -------------------------------------------------------------------------------------
def _child_rows(recs) -> list[list[str]]:
    return [[r.id, r.status, r.snapshot, r.pool or "-", "claimed" if r.claimed else "idle" if r.pool else "-",
             str(r.pid or "-"), ms(r.timings_ms.get("restore")), ms(r.timings_ms.get("ready"))] for r in recs]


CHILD_COLUMNS = [("ID", "left"), ("STATUS", "left"), ("SNAPSHOT", "left"), ("POOL", "left"), ("CLAIM", "left"),
                 ("PID", "right"), ("RESTORE ms", "right"), ("READY ms", "right")]


@app.command()
def fork(tag: str = typer.Option(..., "--tag", "-t", help="snapshot to fork from"),
         n: int = typer.Option(1, "-n", help="number of children (1..1000)"),
         timeout: float = typer.Option(60.0, help="seconds to wait for each child to answer"),
         per_child_netns: bool = typer.Option(False, "--per-child-netns",
                                              help="require network isolation (the snapshot must have a NIC)"),
         memory_limit_mib: int | None = typer.Option(None, "--memory-limit-mib", help="cgroup memory limit"),
         allow_unconstrained: bool = typer.Option(False, "--allow-unconstrained",
                                                  help="start children even where no cgroup can constrain them"),
         output: Fmt = OUTPUT) -> None:
    """Fork N children of a snapshot; returns when every child answered. Children outlive this command."""
    t0 = time.perf_counter()
    recs = rt().fork(Spawn.of(tag=tag, n=n, timeout=timeout, network="isolated" if per_child_netns else None,
                              memory_limit_mib=memory_limit_mib, allow_unconstrained=allow_unconstrained),
                     progress=Progress(quiet=output != Fmt.table))
    total = (time.perf_counter() - t0) * 1000.0
    emit({"children": [r.to_json() for r in recs], "all_answered_ms": total}, output, CHILD_COLUMNS,
         _child_rows(recs))
    if output == Fmt.table:
        out.print(f"{len(recs)} children answering, the last after {total:.0f} ms")


@app.command("gc")
def gc(dry_run: bool = typer.Option(False, "--dry-run", help="report what would be removed, remove nothing"),
       grace: float = typer.Option(60.0, help="seconds an unrecorded object may be a spawn still in progress"),
       output: Fmt = OUTPUT) -> None:
    """Adopt live children; remove dead ones and orphaned namespaces, veths, taps, cgroups, sockets, memory
    files and VMM processes (identified by recorded pid + start time, or by our naming, never by process name)."""
    rep = rt().gc(dry_run=dry_run, grace=grace)
    kinds = ("reaped", "processes", "netns", "veths", "leases", "cgroups", "dirs", "memory_files", "overlay_templates")
    emit(rep, output, [("KIND", "left"), ("COUNT", "right"), ("ITEMS", "left")],
         [[k, str(len(rep[k])), " ".join(str(x) for x in rep[k][:6])] for k in ("adopted", *kinds)])
    if output == Fmt.table:
        out.print(f"{'would remove' if dry_run else 'removed'} {rep['leftovers']} leftovers; "
                  f"{len(rep['adopted'])} live children adopted")


@app.command("ls")
def ls(output: Fmt = OUTPUT) -> None:
    """List children (running, dead = its VMM is gone, failed)."""
    recs = rt().children()
    emit([dict(r.to_json(), status=r.status) for r in recs], output, CHILD_COLUMNS, _child_rows(recs))


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(child: str, cmd: list[str] = typer.Argument(None, help="command and arguments (after --)"),
          timeout: float | None = typer.Option(None, help="seconds before the command is killed"),
          cwd: str | None = typer.Option(None, help="working directory in the guest"),
          output: Fmt = OUTPUT) -> None:
    """Run a command in a child: forkd exec ID -- CMD [ARGS...]. Exits with the command's exit code."""
    argv = list(cmd or [])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    res = rt().exec(child, argv, cwd=cwd, timeout=timeout)
    if output != Fmt.table:
        emit(res, output)
    else:
        sys.stdout.write(res["stdout"])
        sys.stderr.write(res["stderr"])
        if res.get("truncated"):
            err.print("[yellow]output truncated[/]")
    raise typer.Exit(124 if res.get("timed_out") else res["exit_code"])


@app.command("eval")
def eval_(child: str, code: str, output: Fmt = OUTPUT,
          timeout: float = typer.Option(60.0, help="seconds to wait for the answer")) -> None:
    """Evaluate a Python expression in the child's warm interpreter and print its repr."""
    res = rt().eval(child, code, timeout=timeout)
    if output != Fmt.table:
        emit(res, output)
    else:
        sys.stdout.write(res["stdout"])
        if res["error"]:
            sys.stderr.write(res["error"].get("traceback") or f"{res['error']['type']}: {res['error']['message']}\n")
        else:
            out.print(res["value"])
    if res["error"]:
        raise typer.Exit(1)


@app.command()
def ping(child: str) -> None:
    """Check that a child's agent answers."""
    t0 = time.perf_counter()
    rt().ping(child)
    out.print(f"{child}: pong in {(time.perf_counter() - t0) * 1000:.1f} ms")


@app.command()
def kill(ids: list[str] = typer.Argument(None, help="child ids"),
         all_: bool = typer.Option(False, "--all", help="kill every child"),
         tag: str | None = typer.Option(None, "--tag", help="kill the children of this snapshot")) -> None:
    """Stop children and remove their records (dead ones too)."""
    for cid, was_running in rt().kill(ids, all_=all_, tag=tag):
        out.print(f"{cid}: {'killed' if was_running else 'removed (was not running)'}")


@app.command()
def quickstart(spec: Path = typer.Option(Path("specs/examples/pool.yaml"), "-f", "--filename",
                                         help="spec with a parent and a pool"),
               n: int = typer.Option(4, "-n", help="children to claim"),
               keep: bool = typer.Option(False, help="leave the claimed children running"),
               output: Fmt = OUTPUT) -> None:
    """The whole tour: apply a parent + pool spec, wait until the pool is warm, claim N children, and run an
    eval and an exec in each."""
    from forkd.client import backend
    from forkd.client.quickstart import run_quickstart

    result = run_quickstart(backend(), rt(), spec, n, keep, progress=Progress(quiet=output != Fmt.table))
    emit(result, output, [("CHILD", "left"), ("EVAL ms", "right"), ("EVAL", "left"), ("EXEC ms", "right"),
                          ("EXEC stdout", "left")],
         [[c["id"], ms(c["eval_ms"]), c["eval"], ms(c["exec_ms"]), c["exec_stdout"]] for c in result["children"]])
    if output == Fmt.table:
        out.print(f"pool '{result['pool']}' Ready after {result['ready_s']:.1f} s; {len(result['children'])} "
                  f"children claimed in {result['claim_ms']:.1f} ms"
                  + ("" if keep else " (and killed again)"))


@app.command()
def serve(watch: Path | None = typer.Option(None, help="apply this directory on every change (GitOps), "
                                                            "pruning objects removed from it"),
          interval: float = typer.Option(2.0, help="seconds between reconcile passes when nothing changes"),
          bind: str | None = typer.Option(None, "--bind", help="also serve the API on TCP HOST:PORT (default port "
                                                               "8889); non-loopback needs --token-file"),
          token_file: Path | None = typer.Option(None, "--token-file", help="bearer token file for TCP (0600; "
                                                                             "created if missing)")) -> None:
    """Run the daemon: the reconcile loop, the API on $FORKD_HOME/forkd.sock, and the children it owns.
    While it runs, apply/get/claim go through it."""
    argv = [sys.executable, "-m", "forkd.api", "serve", "--interval", str(interval)]
    if bind is not None:
        argv += ["--bind", bind]
    if token_file is not None:
        argv += ["--token-file", str(token_file.resolve())]
    if watch is not None:
        if not watch.is_dir():
            raise typer.BadParameter(f"{watch} is not a directory")
        argv += ["--watch", str(watch.resolve())]
    os.execv(sys.executable, argv)


audit_app = typer.Typer(help="The daemon's hash-chained audit log ($FORKD_HOME/audit.log).", no_args_is_help=True)
app.add_typer(audit_app, name="audit")


@audit_app.command("verify")
def audit_verify() -> None:
    """Check the audit log's hash chain: prints OK, or the first bad line and exits 1."""
    from forkd.core.audit import verify

    verdict = verify(rt().layout.home)
    out.print(str(verdict))
    if not verdict.ok:
        raise typer.Exit(1)


declarative.register(app)
packs_cli.register(app)
images_cli.register(app)
branch_cli.register(app, snapshot_app)
k8s.register(app)


def main() -> None:
    try:
        app()
    except ForkdError as exc:
        err.print(f"[red]error:[/] {escape(exc.message)}")
        if exc.hint:
            err.print(f"[dim]hint:[/] {escape(exc.hint)}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except OSError as exc:  # an environment problem forkd did not anticipate: say what, without a traceback
        err.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
