"""How a pool's warm children are split across nodes by their room: a pure function over numbers (no I/O).

`room[node]` is how many more children of the pool a node can take now (its available memory over the pool's
per-child need), `current[node]` how many of the pool's warm children it holds already (their memory is no longer
available, so a node's capacity for the pool is room + current). The rules, in order:
  * a pool that fits on one node, and holds children nowhere yet, goes to one node (one parent build, one place
    to claim from): the one with the most capacity, rendezvous hashing of `key` breaking ties;
  * otherwise existing shares are kept as far as capacity allows (no child is moved for balance);
  * growth goes one child at a time to the node with the most capacity left (so shares follow capacity), hashing
    breaking ties; shrinking takes from the node with the least capacity left first;
  * not enough capacity in total: NoRoom, naming what each node has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


class NoRoom(ValueError):
    """The nodes together cannot hold `warm` children of the pool."""


def _score(node: str, key: str) -> str:
    return hashlib.sha256(f"{node}|{key}".encode()).hexdigest()


def split_warm(warm: int, room: Mapping[str, int], current: Mapping[str, int] | None = None,
               key: str = "") -> dict[str, int]:
    """node -> how many warm children of the pool it keeps (nodes with none are left out). Raises NoRoom."""
    if warm < 0:
        raise ValueError(f"warm {warm}: must be 0 or more")
    current = {n: max(0, int(v)) for n, v in (current or {}).items() if n in room}
    cap = {n: max(0, int(room[n])) + current.get(n, 0) for n in room}
    if sum(cap.values()) < warm:
        have = ", ".join(f"{n}: {cap[n]}" for n in sorted(cap)) or "no node"
        raise NoRoom(f"{warm} warm children do not fit: room for {sum(cap.values())} ({have})")
    if warm == 0:
        return {}
    if not any(current.values()):
        fits = [n for n in sorted(cap) if cap[n] >= warm]
        if fits:
            return {max(fits, key=lambda n: (cap[n], _score(n, key))): warm}
    share = {n: min(current.get(n, 0), cap[n]) for n in cap}
    while sum(share.values()) > warm:
        n = min((n for n in sorted(share) if share[n] > 0), key=lambda n: (cap[n] - share[n], _score(n, key)))
        share[n] -= 1
    while sum(share.values()) < warm:
        n = max((n for n in sorted(cap) if cap[n] > share[n]), key=lambda n: (cap[n] - share[n], _score(n, key)))
        share[n] += 1
    return {n: v for n, v in sorted(share.items()) if v}
