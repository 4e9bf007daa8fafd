"""How the harness judges a pool that is not back at its target after a restart: whether it can be (its
maxChildren may be taken by claimed children, which nothing may remove), whether the reconciler is still getting
there (the deadline is a stall budget, not a stopwatch), and what to record when it is not (the pool's children
and its last events), so a violation names its cause.

A pool's children are read from the registry (their records), independently of the status the daemon writes: a
check that believed the reconciler's own account could not catch the reconciler lying."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

LIVE = ("starting", "running", "stopping")  # what counts against a pool's maxChildren (as forkd.reconciler.world)
SPAWN_BOUND_S = 600.0  # a spawn's own timeouts end it within this (restore steps, the default prime): no stall


def attainable(pool: dict, children: Iterable) -> int:
    """How many warm children the pool can have now: its target, or fewer when its maxChildren is taken by live
    children that are not idle (claimed, or being stopped), which no reconciler may remove."""
    name, spec = pool["metadata"]["name"], pool["spec"]
    want, cap = spec["warm"], spec.get("maxChildren")
    if cap is None:
        return want
    held = [c for c in children if c.pool == name and c.status in LIVE and (c.claimed or c.status == "stopping")]
    return max(0, min(want, cap - len(held)))


def describe(pool: dict, children: Iterable, events: list[dict], now: float | None = None) -> str:
    """The pool's children (status, claimed, spawner alive) and its last events: what a violation records."""
    name = pool["metadata"]["name"]
    now = time.time() if now is None else now
    mine = sorted((c for c in children if c.pool == name), key=lambda c: c.created_at)
    kids = ", ".join(f"{c.id} {c.status}{' claimed' if c.claimed else ''} {now - c.created_at:.0f}s old"
                     for c in mine) or "none"
    evs = "; ".join(f"{now - e.get('time', now):.0f}s ago {e.get('type', '')} {e.get('reason', '')}: "
                    f"{str(e.get('message', ''))[:200]}" for e in events[-3:]) or "none"
    return f"children: {kids}; maxChildren {pool['spec'].get('maxChildren')}; last events: {evs}"


def _signature(pools: list[dict], children: Iterable) -> tuple:
    """What changes while the reconciler works on the pools: their children (id, status, claimed) and their
    statuses' warm counts and condition reasons."""
    names = {p["metadata"]["name"] for p in pools}
    kids = sorted((c.id, c.status, c.claimed) for c in children if c.pool in names)
    stats = sorted((p["metadata"]["name"], (p.get("status") or {}).get("warm"),
                    tuple(sorted((c.get("type"), c.get("status"), c.get("reason"))
                                 for c in (p.get("status") or {}).get("conditions", []))))
                   for p in pools)
    return tuple(kids), tuple(stats)


def spawning(pools: list[dict], children: Iterable, now: float | None = None) -> list[str]:
    """Children of these pools being spawned by a live process, younger than SPAWN_BOUND_S: work in progress
    that ends by its own timeouts, not a stall (a `starting` child whose spawner died reads `dead`)."""
    names = {p["metadata"]["name"] for p in pools}
    now = time.time() if now is None else now
    return [c.id for c in children if c.pool in names and c.status == "starting" and now - c.created_at < SPAWN_BOUND_S]


@dataclass
class Watch:
    """Progress of the pools short of their target: `stalled_for()` is the time since anything about them last
    changed, or 0 while one of their children is being spawned (bounded by SPAWN_BOUND_S)."""

    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time  # what the records' created_at are on
    last: tuple | None = None
    since: float = field(default=0.0)

    def see(self, short: list[dict], children: list) -> float:
        """Record what the short pools look like now; returns how long they have not moved."""
        now = self.clock()
        sig = _signature(short, children)
        if sig != self.last or spawning(short, children, self.wall()):
            self.last, self.since = sig, now
        return now - self.since


def wait_pools(read: Callable[[], tuple[list[dict], list]], stall: float, cap: float,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               wall: Callable[[], float] = time.time) -> tuple[float | None, str]:
    """Wait until every pool `read()` gives (pools, children's records) is back at its target as check_pools
    judges it; returns (seconds, "") or, once the pools short of it did not move for `stall` seconds, or `cap`
    seconds passed in all, (None, why). A read failing with OSError (a daemon restarting) is no answer yet."""
    from tests.chaos.invariants import check_pools  # it imports this module

    t0, watch, still = clock(), Watch(clock, wall), 0.0
    while (waited := clock() - t0) < cap:
        try:
            pools, children = read()
            if not check_pools(pools, children):
                return waited, ""
            short = [p for p in pools if check_pools([p], children)]
            still = watch.see(short, children)
            if still >= stall:
                return None, f"stalled: nothing about the pools short of their target changed for {still:.0f} s"
        except OSError:
            pass
        sleep(0.25)
    return None, f"still changing after {cap:.0f} s (last change {still:.0f} s before): slow, not stalled"
