"""Latency observations from the low layers, for whoever listens (the API's Prometheus metrics).

The core and the reconciler cannot import forkd.api, so they report here (`observe`, `timed`, `spawned`) and
subscribers (objects with an `observe(event, seconds, labels)` method) receive every observation. Subscribers are
held weakly: an app that goes away stops listening without unsubscribing. No subscriber: an observation costs a
function call. A subscriber that raises is ignored (metrics must never break a spawn or a claim).

Events and their labels (values bounded: pools are few, actions and kinds are fixed sets):
- `spawn`: one child, restore to first agent answer; `pool` ("" outside a pool), `reason` (direct, refill, claim)
- `claim`: one claim call that handed out children; `pool` (the qualified name of a pool that exists)
- `claim_failed`: one claim call that failed (counted, not timed with the claims); `pool` ("" when the name given
  was no pool), `reason` (the error's kind)
- `exec`: one guest command; `kind` (exec, eval, exec_code)
- `reconcile`: one reconcile step (all its passes)
- `reconcile_action`: one action the reconciler ran; `action` (its type), `pool` ("" if not a pool's)
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Observer(Protocol):
    def observe(self, event: str, seconds: float, labels: dict[str, str]) -> None: ...


_observers: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def subscribe(observer: Observer) -> None:
    with _lock:
        _observers.add(observer)


def unsubscribe(observer: Observer) -> None:
    with _lock:
        _observers.discard(observer)


def observe(event: str, seconds: float, **labels: str) -> None:
    with _lock:
        targets = list(_observers)
    for obs in targets:
        try:
            obs.observe(event, seconds, {k: str(v) for k, v in labels.items()})
        except Exception:  # noqa: BLE001, S112 - a broken subscriber must not break the operation observed
            continue


@contextmanager
def timed(event: str, **labels: str) -> Iterator[None]:
    """Observe how long the block took (also when it raised: a slow failure is still latency)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        observe(event, time.perf_counter() - t0, **labels)


def spawned(records: Iterable[Any], pool: str | None, claimed: bool) -> None:
    """One `spawn` observation per child record that answered (its timings_ms["ready"])."""
    reason = "claim" if claimed else ("refill" if pool else "direct")
    for rec in records:
        ready = getattr(rec, "timings_ms", {}).get("ready")
        if ready is not None:
            observe("spawn", ready / 1000.0, pool=pool or "", reason=reason)
