"""How a pool's warm children are split across nodes by their room: a pure function over numbers (no I/O).

`room[node]` is how many more children of the pool a node can take now (its available memory over the pool's
per-child need), `current[node]` how many of the pool's warm children it holds already (their memory is no longer
available, so a node's capacity for the pool is room + current). The rules, in order:
  * a pool that fits on one node, and holds children nowhere yet, goes to one node (one parent build, one place
    to claim from): the one with the most capacity, rendezvous hashing of `key` breaking ties;
  * a pool held on one node only that still fits there stays there;
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
    holding = [n for n in sorted(current) if current[n] > 0]
    if len(holding) == 1 and cap[holding[0]] >= warm:  # on one node and still fits there: it stays one node
        return {holding[0]: warm}
    share = {n: min(current.get(n, 0), cap[n]) for n in cap}
    while sum(share.values()) > warm:
        n = min((n for n in sorted(share) if share[n] > 0), key=lambda n: (cap[n] - share[n], _score(n, key)))
        share[n] -= 1
    while sum(share.values()) < warm:
        n = max((n for n in sorted(cap) if cap[n] > share[n]), key=lambda n: (cap[n] - share[n], _score(n, key)))
        share[n] += 1
    return {n: v for n, v in sorted(share.items()) if v}


def node_room(available_mib: int, per_child_mib: int, assigned: int = 0, warm_now: int = 0) -> int:
    """How many more children of a pool a node can take: its available memory over the per-child need, less the
    children of its share not yet restored (`assigned` - `warm_now`: their memory is not yet taken)."""
    if per_child_mib <= 0:
        raise ValueError(f"per-child memory {per_child_mib} MiB: must be positive")
    pending = max(0, int(assigned) - max(0, int(warm_now)))
    return max(0, max(0, int(available_mib)) // int(per_child_mib) - pending)


def split_claim(count: int, warm: Mapping[str, int], key: str = "") -> dict[str, int]:
    """node -> how many children of a claim it serves: from the node with the most warm children first (fewest
    nodes, no forking while warm ones wait), hashing of `key` breaking ties; what no warm child covers goes to the
    node with the most warm children (its daemon forks the rest on the spot). Raises NoRoom without any node."""
    if count < 1:
        raise ValueError(f"count {count}: must be 1 or more")
    if not warm:
        raise NoRoom(f"a claim of {count} children: no node holds the pool")
    left = {n: max(0, int(v)) for n, v in warm.items()}
    order = sorted(sorted(left), key=lambda n: (left[n], _score(n, key)), reverse=True)
    out: dict[str, int] = {}
    need = count
    for n in order:
        take = min(need, left[n])
        if take:
            out[n] = take
            need -= take
    if need:
        out[order[0]] = out.get(order[0], 0) + need
    return dict(sorted(out.items()))


def placed_claim(children: list[Mapping], held: Mapping[str, int]) -> dict[str, int]:
    """node -> children of a claim already placed: each node whose daemon holds the claim (its count there), and
    each node the last status puts children on that no daemon answers for (a node that left: its children are
    reported lost; a known node that lost the object: it is applied again). A node whose daemon holds the claim
    but has not claimed yet has no children in the status: it is placed all the same (the daemon's answer, not
    the status, says where a claim is)."""
    out = {n: int(k) for n, k in held.items()}
    listed: dict[str, int] = {}
    for child in children:
        node = child.get("node")
        if node:
            listed[node] = listed.get(node, 0) + 1
    for node, k in listed.items():
        if node not in out:
            out[node] = k
    return dict(sorted(out.items()))
