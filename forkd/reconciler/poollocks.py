"""One lock per pool in this process. Forks for a pool (the reconciler's refills, claims forking on the spot) run
one at a time under it, so each counts the pool's children against maxChildren without missing another fork's
children that are still being created: a fork writes each child's record only when that child's restore starts.
The daemon owns its FORKD_HOME while it runs (one process: forkd.base.locks), so a lock per process is a lock per
home; without a daemon, two CLI processes claiming from one pool at once may still pass the cap together."""

from __future__ import annotations

import threading

_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


def pool_lock(pool: str) -> threading.Lock:
    """The lock of `pool` (its qualified name), made on first use."""
    with _GUARD:
        return _LOCKS.setdefault(pool, threading.Lock())
