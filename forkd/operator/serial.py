"""One reconcile at a time per resource.

kopf runs a resource's timer beside its create / update / resume handlers, each in a thread of its own: two
reconciles of one ForkClaim at once could each place it (on different nodes, from different views of the warm
children), and every overlap doubles the calls to the node daemons. A change handler waits for the resource's
reconcile in flight; a timer tick that finds one in flight is skipped (that reconcile does the work, and the next
tick comes anyway).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def _key(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return str(meta.get("uid") or f"{body.get('kind')}/{meta.get('namespace')}/{meta.get('name')}")


@contextmanager
def held(body: Mapping[str, Any], wait: bool = True) -> Iterator[bool]:
    """Hold the resource's lock for the block: yields True when held, False (at once) when `wait` is off and a
    reconcile of the resource is in flight."""
    with _guard:
        lock = _locks.setdefault(_key(body), threading.Lock())
    got = lock.acquire(blocking=wait)
    try:
        yield got
    finally:
        if got:
            lock.release()


def forget(body: Mapping[str, Any]) -> None:
    """The resource is gone: drop its lock."""
    with _guard:
        _locks.pop(_key(body), None)
