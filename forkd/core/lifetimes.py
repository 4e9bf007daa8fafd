"""Sandbox lifetimes, labels and the clean-up of throw-away branch snapshots.

A sandbox made by `POST /v1/sandboxes`, `/fork` or `forkd fork` through the daemon carries `expires_at` in its child
record (default FORKD_SANDBOX_TIMEOUT from its creation; `set_timeout` moves it to now + seconds). The daemon's
sweeper (forkd.core.sweeper) calls `sweep` every FORKD_SWEEP_INTERVAL seconds: expired hand-made children are
killed (pool children are the reconciler's: idle ones have no expiry, claimed ones are retired by it), then
snapshots forkd named itself are removed by policy:

- `forkd.dev/auto: branch`: a branch made without a tag, removed FORKD_BRANCH_TTL seconds after it was written;
- `forkd.dev/auto: fork`: the branch behind `fork(n)` without `keep`/`tag`, removed once none of its children run.

Neither is removed while a child runs on it or a layer is built on it (Runtime.rmi refuses, and the sweeper
leaves it for the next pass)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from forkd.base import clock
from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound

log = logging.getLogger(__name__)
AUTO = "forkd.dev/auto"  # label on snapshots forkd named itself: "branch" | "fork"
LIVE = ("running", "starting")


@dataclass
class Swept:
    expired: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def stamp(rt: Any, ids: list[str], seconds: float | None, labels: dict[str, str] | None = None) -> list:
    """Give children their lifetime (`seconds` from now; None: no expiry) and labels; returns the new records.
    The end is kept twice: `expires_at` on the wall clock (shown), `expires_boot` on CLOCK_BOOTTIME (compared:
    forkd.base.clock), so a stepped clock neither shortens nor stretches a lifetime."""
    end, boot_end = clock.deadline(seconds or None)
    out = []
    with rt.registry.locked():
        for cid in ids:
            rec = rt.registry.get(cid)
            changes: dict[str, Any] = {"expires_at": end, "expires_boot": boot_end}
            if labels:
                changes["labels"] = {**(rec.labels or {}), **labels}
            out.append(rt.registry.save(rec.with_(**changes)))
    return out


def set_timeout(rt: Any, child_id: str, seconds: float) -> Any:
    """Extend (or shorten) a running sandbox's life: it now expires `seconds` from now. Idle pool children have no
    timeout until claimed: refused for them (claim it first)."""
    rec = rt.registry.get(child_id)
    if rec.status not in LIVE:
        raise Conflict(f"sandbox {child_id} is {rec.status}: nothing to extend", hint="start a new one")
    if rec.pool and not rec.claimed:
        raise InvalidInput(f"sandbox {child_id} is idle in pool {rec.pool!r}: it has no timeout until claimed",
                           hint=f"claim it first (POST /v1/pools/{rec.pool}/claim)")
    return stamp(rt, [child_id], seconds)[0]


def parse_selector(items: list[str] | None) -> list[tuple[str, str | None]]:
    """`["k=v", ...]` (query `?label=k=v`, CLI `-l k=v`) -> [(k, v)]; a bare `k` matches any value (None).
    Every term must hold (AND)."""
    out: list[tuple[str, str | None]] = []
    for item in items or []:
        k, sep, v = item.partition("=")
        if not k:
            raise InvalidInput(f"label selector {item!r}: expected key=value", hint="e.g. ?label=team=search")
        out.append((k, v if sep else None))
    return out


def matches(labels: dict[str, str] | None, selector: list[tuple[str, str | None]]) -> bool:
    labels = labels or {}
    return all(k in labels and (v is None or labels[k] == v) for k, v in selector)


def expired(rec: Any, now: float, boot: float) -> bool:
    """Whether a child's lifetime is over: by its CLOCK_BOOTTIME end when it has one (`boot` is that clock now),
    else (a record of an older forkd) by the wall clock (`now`)."""
    return clock.ended(rec.expires_at, rec.expires_boot, now, boot)


def _expired(rt: Any, now: float, boot: float) -> list:
    return [r for r in rt.children() if r.pool is None and expired(r, now, boot) and r.status in LIVE]


def _removable(rt: Any, snap: Any, now: float, branch_ttl: float, users: set[str]) -> bool:
    kind = (getattr(snap, "labels", None) or {}).get(AUTO)
    if kind == "fork":
        return snap.tag not in users and now - snap.created_at > 30.0  # its spawns start right after it (eager: kill)
    return kind == "branch" and now - snap.created_at > branch_ttl


def sweep(rt: Any, now: float | None = None, branch_ttl: float = 3600.0, on_expire=None) -> Swept:
    """One pass: kill expired sandboxes, then remove forkd-named snapshots whose policy says so (never one in use)."""
    now = clock.wall() if now is None else now
    out = Swept()
    for rec in _expired(rt, now, clock.elapsed()):
        try:
            rt.kill([rec.id])
        except NotFound:
            continue
        out.expired.append(rec.id)
        log.info("sandbox %s expired (its timeout passed at %.0f): killed", rec.id, rec.expires_at)
        if on_expire:
            on_expire(rec)
    users = {c.snapshot for c in rt.children() if c.status in LIVE}
    for snap in rt.snapshots():
        if hasattr(snap, "tag") and snap.status != "writing" and _removable(rt, snap, now, branch_ttl, users):
            out.removed += release(rt, snap.tag)
    return out


def release(rt: Any, tag: str) -> list[str]:
    """Remove a forkd-named snapshot if nothing uses it any more; [] if something still does."""
    try:
        return rt.rmi(tag)
    except (Conflict, NotFound):
        return []
    except ForkdError as e:
        log.warning("could not remove snapshot %s: %s", tag, e)
        return []


def release_fork_of(rt: Any, tag: str) -> list[str]:
    """After a kill: the `fork` snapshot `tag` goes with the last of its children."""
    try:
        snap = rt.store.get(tag)
    except ForkdError:
        return []
    if (getattr(snap, "labels", None) or {}).get(AUTO) != "fork":
        return []
    if any(c.snapshot == tag and c.status in LIVE for c in rt.children()):
        return []
    return release(rt, tag)
