"""The verbs whose work is one call to the backend and a print, without typer: forkd.cli.direct runs them before the
command tree is built, and their typer commands (forkd.cli.main) call the same functions. Each returns its exit
code (None: 0); forkd's own errors are raised, and printed by whichever runs them."""

from __future__ import annotations

import sys
import time

from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, emit, old_spelling, out

GC_KINDS = ("reaped", "processes", "netns", "veths", "leases", "cgroups", "dirs", "memory_files", "temporaries",
            "overlay_templates")
INFO_KEYS = ["tag", "status", "error", "path", "depth", "ancestors", "dependents", "materialized", "chain_error",
             "parent_tag", "diff_pages", "memory_mib", "vcpus", "accel", "image_id", "qemu_version",
             "warm_imports", "warm_exec", "warm_run", "logical_bytes", "stored_bytes", "memory_sha256", "disk_sha256",
             "disk_bytes", "children", "timings_ms"]


def ping(child: str) -> None:
    """`forkd ping`."""
    t0 = time.perf_counter()
    backend().ping(child)
    out.print(f"{child}: pong in {(time.perf_counter() - t0) * 1000:.1f} ms")


def eval_(child: str, code: str, output: str | None = None, timeout: float = 60.0) -> int:
    """`forkd eval`: 1 when the guest raised."""
    res = backend().eval(child, code, timeout=timeout)
    if (output or Fmt.table) != Fmt.table:
        emit(res, Fmt(output))
    else:
        sys.stdout.write(res["stdout"])
        if res["error"]:
            sys.stderr.write(res["error"].get("traceback") or f"{res['error']['type']}: {res['error']['message']}\n")
        else:
            sys.stdout.write(f"{res['value']}\n")  # the guest's text, as it is (no style tags read in it)
    return 1 if res["error"] else 0


def kill(ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> None:
    """`forkd kill`."""
    for cid, was_running in backend().kill(ids or None, all_=all_, tag=tag):
        out.print(f"{cid}: {'killed' if was_running else 'removed (was not running)'}")


def gc(dry_run: bool = False, grace: float = 60.0, output: str | None = None) -> None:
    """`forkd gc`."""
    rep = backend().gc(dry_run=dry_run, grace=grace)
    fmt = Fmt(output or Fmt.table)
    emit(rep, fmt, [("KIND", "left"), ("COUNT", "right"), ("ITEMS", "left")],
         [[k, str(len(rep[k])), " ".join(str(x) for x in rep[k][:6])] for k in ("adopted", *GC_KINDS)])
    if fmt == Fmt.table:
        out.print(f"{'would remove' if dry_run else 'removed'} {rep['leftovers']} leftovers; "
                  f"{len(rep['adopted'])} live children adopted")


def audit_verify() -> int:
    """`forkd audit verify`: 1 when the chain is broken."""
    verdict = backend().audit_verify()
    out.print(verdict["text"])
    return 0 if verdict["ok"] else 1


def snapshot_info(tag: str, output: str | None = None) -> None:
    """`forkd snapshot info`."""
    info = backend().snapshot_info(tag)
    emit(info, Fmt(output or Fmt.table), [("FIELD", "left"), ("VALUE", "left")],
         [[k, str(info.get(k))] for k in INFO_KEYS])


def snapshot_rm(tag: str, force: bool = False, force_old: bool = False, cascade: bool = False) -> None:
    """`forkd snapshot rm` (`-f`: the old spelling of --force, warned)."""
    if force_old:
        old_spelling("snapshot rm -f", "snapshot rm --force")
    for t in backend().rmi(tag, force=force or force_old, cascade=cascade):
        out.print(f"deleted {t}")
