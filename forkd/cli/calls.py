"""The verbs whose work is one call to the backend and a print, without typer: forkd.cli.direct runs them before the
command tree is built, and their typer commands (forkd.cli.main) call the same functions. Each returns its exit
code (None: 0); forkd's own errors are raised, and printed by whichever runs them."""

from __future__ import annotations

import sys
import time
from typing import Any

from forkd.base.errors import InvalidInput
from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, Progress, emit, err, old_spelling, out
from forkd.cli.reading import CHILD_COLUMNS, child_rows

# Spawn's fields -> the flags a user types for them (errors name the flag, forkd.core.requests.invalid_flags)
SPAWN_FLAGS = {"tag": "--tag", "n": "--count", "timeout": "--timeout", "network": "--per-child-netns",
               "memory_limit_mib": "--memory-limit-mib", "allow_unconstrained": "--allow-unconstrained",
               "prime": "--prime", "egress": "--egress"}

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


def fork(tag: str | None = None, from_sandbox: str | None = None, keep: bool = False, n: int = 1,
         n_old: int | None = None, timeout: float = 60.0, per_child_netns: bool = False,
         memory_limit_mib: int | None = None, egress: list[str] | None = None, allow_unconstrained: bool = False,
         prime: list[str] | None = None, output: str | None = None) -> int:
    """`forkd fork` (`n_old`: `-n N`, the old spelling of --count, warned): 2 for flags that do not go together."""
    t0, fmt = time.perf_counter(), Fmt(output or Fmt.table)
    if tag is None and from_sandbox is None:
        err.print("[red]error:[/] name a snapshot (--tag T) or a running child (--from-sandbox ID)")
        return 2
    if n_old is not None:
        old_spelling("-n N", "--count N")
        n = n_old
    if from_sandbox and prime:
        err.print("[red]error:[/] --prime applies to children of a snapshot (--tag), not to --from-sandbox: "
                  "run the command in the child before forking it")
        return 2
    policy = egress_json(egress)
    if from_sandbox:
        from forkd.client import parse_egress

        policy = None if policy is None else parse_egress(policy, "--egress")
        recs = backend().fork_from(from_sandbox, n, tag=tag, keep=keep, egress=policy)
        emit({"children": recs}, fmt, CHILD_COLUMNS, child_rows(recs))
        return 0
    fields = {"tag": tag, "n": n, "timeout": timeout, "network": "isolated" if per_child_netns else None,
              "memory_limit_mib": memory_limit_mib, "allow_unconstrained": allow_unconstrained,
              "prime": list(prime or ()), "egress": policy or "none"}
    recs = _spawn(backend(), fields, Progress(quiet=fmt != Fmt.table))
    total = (time.perf_counter() - t0) * 1000.0
    emit({"children": recs, "all_answered_ms": total}, fmt, CHILD_COLUMNS, child_rows(recs))
    if fmt == Fmt.table:
        out.print(f"{len(recs)} children answering, the last after {total:.0f} ms")
    return 0


def egress_json(values: list[str] | None) -> Any:
    """--egress values (none | internet | CIDR:port, repeated) as a request's JSON says them ("none", "internet" or
    {"allow": [...]}), for the daemon to check; None when not given. InvalidInput: none or internet beside
    CIDR:port entries."""
    if not values:
        return None
    if len(values) == 1 and values[0] in ("none", "internet"):
        return values[0]
    if any(v in ("none", "internet") for v in values):
        raise InvalidInput("--egress none or internet stands alone; an allow list is CIDR:port entries only",
                           hint="fix --egress and run the command again")
    return {"allow": list(values)}


def _spawn(b: Any, fields: dict[str, Any], progress: Progress) -> list:
    """`forkd fork --tag`'s children. A daemon takes the request as JSON and checks it itself; when it refuses it
    (422), the same rules run here, so that the error names the flags typed (SPAWN_FLAGS), not the fields."""
    if not getattr(b, "plain", False):  # in-process: the typed request
        from forkd.client import Spawn

        return b.fork(Spawn.of(flags=SPAWN_FLAGS, **fields), progress=progress)
    try:
        return b.fork(fields, progress=progress)
    except InvalidInput as exc:
        if exc.status == 422:
            from forkd.client import Spawn

            Spawn.of(flags=SPAWN_FLAGS, **fields)
        raise


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
