"""plan(desired, actual) -> actions: the pure heart of the reconciler.

Pure and deterministic: no I/O, no clock (time is `actual.now`), no randomness; inputs are sorted first, so the
same inputs in any tuple order give the same list in the same order: parents (by name), then per pool (by name)
its retirements and its spawn, then orphaned children (by id), then snapshot deletions (by tag).
Layers are built once their `from` snapshot is ready; a pool whose chain is deeper than `compaction.maxDepth`, or
whose spawn p50 exceeds `spawnLatencyTarget.p50Ms`, gets its chain head compacted into a base it then spawns from.
A ForkBranch snapshots a running child (by id, or the oldest claimed child of `pool/<name>`) once; pools and
layers can then use it as their `from`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from forkd.reconciler.actions import (
    Action,
    BuildBranch,
    BuildLayer,
    BuildParent,
    CompactSnapshot,
    DeleteSnapshot,
    RetireChild,
    SpawnChildren,
)
from forkd.reconciler.state import Actual, ChildState, Desired, Failure, SnapshotState
from forkd.spec.models import ForkBranch, ForkLayer, ForkParent, ForkPool, spec_hash

LIVE = ("starting", "running")  # children that count; dead / failed ones are retired and replaced
GONE = ("dead", "failed", "oom-killed")


def parent_tag(parent: ForkParent) -> str:
    """The snapshot tag of a parent's current spec: "<name>-<10 hex digits>" (names are <= 52 characters)."""
    return f"{parent.metadata.name}-{spec_hash(parent)[:10]}"


def layer_tag(layer: ForkLayer, from_tag: str) -> str:
    """A layer's snapshot tag: changes with its spec and with the snapshot it is built on."""
    return f"{layer.metadata.name}-{hashlib.sha256(f'{spec_hash(layer)}:{from_tag}'.encode()).hexdigest()[:10]}"


def compact_tag(head: str) -> str:
    """The tag of the base snapshot a chain head is compacted into."""
    return "cmp-" + hashlib.sha256(head.encode()).hexdigest()[:16]


def branch_tag(b: ForkBranch) -> str:
    return f"{b.metadata.name}-{spec_hash(b)[:10]}"


def branch_source(b: ForkBranch, children: Sequence[ChildState]) -> ChildState | None:
    """The running child a branch snapshots: by id, or the oldest claimed child of `pool/<name>`."""
    want = b.spec.sandbox
    if want.startswith("pool/"):
        pool = want.split("/", 1)[1]
        cands = [c for c in children if c.pool == pool and c.claimed and c.status == "running"]
        return min(cands, key=lambda c: (c.created_at, c.id)) if cands else None
    return next((c for c in children if c.id == want and c.status == "running"), None)


def resolve_tags(parents: Sequence[ForkParent], layers: Sequence[ForkLayer],
                 branches: Sequence[ForkBranch] = ()) -> dict[str, str]:
    """Object name -> the snapshot tag it stands for (parents and branches first; layers once their `from`
    resolves; a cycle or an unknown `from` leaves a layer out)."""
    tags = {b.metadata.name: branch_tag(b) for b in branches}
    tags.update({p.metadata.name: parent_tag(p) for p in parents})
    changed = True
    while changed:
        changed = False
        for la in layers:
            n = la.metadata.name
            if n not in tags and la.spec.from_ in tags:
                tags[n] = layer_tag(la, tags[la.spec.from_])
                changed = True
    return tags


def chain_depth(tag: str, snaps: dict[str, SnapshotState]) -> int:
    depth, seen = 0, {tag}
    while (s := snaps.get(tag)) is not None and s.parent_tag and s.parent_tag not in seen and depth < 256:
        tag = s.parent_tag
        seen.add(tag)
        depth += 1
    return depth


def backoff_seconds(attempts: int) -> float:
    """Delay before retrying an object whose action failed `attempts` times in a row (used by the executor)."""
    return float(min(300, 2 ** min(attempts, 16)))


# -- shared views (also used by status) ---------------------------------------------------------------------
def unique_by_name(objs: Iterable) -> list:
    """Objects sorted by name, one per name (duplicates: the smallest spec hash wins, whatever the input order)."""
    best: dict[str, object] = {}
    for o in objs:
        n = o.metadata.name
        if n not in best or spec_hash(o) < spec_hash(best[n]):
            best[n] = o
    return [best[n] for n in sorted(best)]


def failures_by_key(actual: Actual) -> dict[str, Failure]:
    """The latest failure per action key ("ForkParent/<name>", "ForkPool/<name>", ...)."""
    out: dict[str, Failure] = {}
    for f in sorted(actual.failures, key=lambda f: (f.retry_at, f.attempts, f.message)):
        out[f"{f.kind}/{f.name}"] = f
    return out


def snapshots_by_tag(actual: Actual) -> dict[str, SnapshotState]:
    return {s.tag: s for s in sorted(actual.snapshots, key=lambda s: (s.tag, s.status, s.created_at))}


def children_by_pool(actual: Actual) -> dict[str, list[ChildState]]:
    out: dict[str, list[ChildState]] = {}
    for c in sorted(actual.children, key=lambda c: c.id):
        if c.pool is not None:
            out.setdefault(c.pool, []).append(c)
    return out


def newest_first(children: Sequence[ChildState]) -> list[ChildState]:
    return sorted(children, key=lambda c: (-c.created_at, c.id))


@dataclass(frozen=True)
class PoolChildren:
    """A pool's children sorted into what the rules treat differently."""

    dead: list[ChildState]  # dead / failed: retired, no longer count
    expired: list[ChildState]  # claimed with an ended ttl: retired
    claimed: list[ChildState]  # claimed, live: never touched
    idle_current: list[ChildState]  # unclaimed, starting/running, on the target tag
    idle_old: list[ChildState]  # unclaimed, starting/running, on any other tag
    other: list[ChildState]  # unclaimed in a status we do not know: left alone, but counted

    @property
    def live(self) -> int:
        return len(self.claimed) + len(self.idle_current) + len(self.idle_old) + len(self.other)


def split_children(children: Sequence[ChildState], target: str | None, now: float) -> PoolChildren:
    p = PoolChildren([], [], [], [], [], [])
    for c in children:
        if c.status in GONE:
            p.dead.append(c)
        elif c.claimed:
            (p.expired if c.expires_at is not None and c.expires_at <= now else p.claimed).append(c)
        elif c.status not in LIVE:
            p.other.append(c)
        else:
            (p.idle_current if target is not None and c.snapshot == target else p.idle_old).append(c)
    return p


def pool_target(pool: ForkPool, tags: dict[str, str], snaps: dict[str, SnapshotState] | None = None) -> str | None:
    """The snapshot tag a pool spawns from: its source's current tag, or the compacted base of that chain head
    once it is ready (None: the source is unknown)."""
    head = tags.get(pool.spec.from_)
    if head is not None and snaps is not None:
        compacted = snaps.get(compact_tag(head))
        if compacted is not None and compacted.status == "ready":
            return compacted.tag
    return head


def compaction_reason(pool: ForkPool, head: str, snaps: dict[str, SnapshotState], p50: float | None) -> str | None:
    """Why the pool's chain head should be compacted now (None: it should not)."""
    depth = chain_depth(head, snaps)
    if depth == 0:
        return None
    if pool.spec.compaction is not None and depth > pool.spec.compaction.maxDepth:
        return f"chain depth {depth} > maxDepth {pool.spec.compaction.maxDepth}"
    target = pool.spec.spawnLatencyTarget
    if target is not None and p50 is not None and p50 > target.p50Ms:
        return f"spawn p50 {p50:.0f} ms > target {target.p50Ms} ms at depth {depth}"
    return None


# -- one function per object kind ---------------------------------------------------------------------------
def plan_parent(parent: ForkParent, tag: str, snaps: dict[str, SnapshotState]) -> list[Action]:
    snap = snaps.get(tag)
    if snap is None or snap.status == "failed":  # back-off of a failed build is applied by the caller
        return [BuildParent(parent.metadata.name, tag, spec_hash(parent))]
    return []  # "writing": in progress; "ready": done


def plan_layer(layer: ForkLayer, tag: str, from_tag: str, snaps: dict[str, SnapshotState]) -> list[Action]:
    src, snap = snaps.get(from_tag), snaps.get(tag)
    if src is None or src.status != "ready":
        return []  # waits for its source
    if snap is None or snap.status == "failed":
        return [BuildLayer(layer.metadata.name, tag, from_tag)]
    return []


def plan_branch(b: ForkBranch, tag: str, snaps: dict[str, SnapshotState],
                children: Sequence[ChildState]) -> list[Action]:
    snap = snaps.get(tag)
    if snap is not None and snap.status != "failed":
        return []  # taken (or being taken): a branch is a one-time snapshot
    src = branch_source(b, children)
    return [BuildBranch(b.metadata.name, src.id, tag, b.spec.mode)] if src else []


def plan_compaction(pool: ForkPool, tags: dict[str, str], snaps: dict[str, SnapshotState],
                    p50: float | None) -> list[Action]:
    head = tags.get(pool.spec.from_)
    src = snaps.get(head) if head else None
    if head is None or src is None or src.status != "ready":
        return []
    existing = snaps.get(compact_tag(head))
    if existing is not None and existing.status != "failed":
        return []  # done or in progress
    reason = compaction_reason(pool, head, snaps, p50)
    return [CompactSnapshot(pool.metadata.name, head, compact_tag(head), reason)] if reason else []


def _retire(pool: str | None, children: Iterable[ChildState], reason: str) -> list[Action]:
    return [RetireChild(pool, c.id, reason) for c in children]


def plan_pool(pool: ForkPool, target: str | None, snaps: dict[str, SnapshotState], children: Sequence[ChildState],
              now: float, may_spawn: bool) -> list[Action]:
    name, warm, cap = pool.metadata.name, pool.spec.warm, pool.spec.maxChildren
    kids = split_children(children, target, now)
    out = (_retire(name, [c for c in kids.dead if c.status != "oom-killed"], "dead")
           + _retire(name, [c for c in kids.dead if c.status == "oom-killed"], "oom-killed")
           + _retire(name, kids.expired, "expired"))
    if target is None:  # from names a ForkLayer or nothing: only the housekeeping above, no spawn / rollout
        return out
    ready = (s := snaps.get(target)) is not None and s.status == "ready"
    may_spawn = may_spawn and ready
    old = newest_first(kids.idle_old)
    if len(kids.idle_current) >= warm:  # enough on the target: finish the rollout, trim the excess
        out += _retire(name, old, "rollout")
        return out + _retire(name, newest_first(kids.idle_current)[: len(kids.idle_current) - warm], "scale-down")
    # Old idle children keep serving claims until the target has `warm` (also while it is not ready yet);
    # only those beyond `warm` are surplus.
    surplus = max(0, len(old) - warm)
    out += _retire(name, old[:surplus], "scale-down")
    old = old[surplus:]
    if not may_spawn:
        return out
    need = warm - len(kids.idle_current)
    room = max(0, cap - (kids.live - surplus))
    if room < need and old:  # maxChildren is full of old idle children: replace them rather than stall
        swap = min(need - room, len(old))
        out += _retire(name, old[:swap], "rollout")
        room += swap
    if (count := min(need, room)) > 0:
        out.append(SpawnChildren(name, target, count))
    return out


def source_network(name: str, parents: Sequence[ForkParent], layers: Sequence[ForkLayer]) -> str | None:
    """The network mode of the ForkParent a pool's `from` descends from (through layers); None: unknown."""
    by_parent = {p.metadata.name: p for p in parents}
    by_layer = {la.metadata.name: la for la in layers}
    seen: set[str] = set()
    while name not in seen:
        seen.add(name)
        if name in by_parent:
            return by_parent[name].spec.network
        if name not in by_layer:
            return None
        name = by_layer[name].spec.from_
    return None


def network_mismatch(pool: ForkPool, parents: Sequence[ForkParent], layers: Sequence[ForkLayer]) -> str | None:
    """Why the pool's child.network cannot work with its parent (None: it can). Children restore the parent's
    device set: an isolated pool needs a parent with a NIC, and a parent with a NIC only has isolated children."""
    net = source_network(pool.spec.from_, parents, layers)
    if net is None or net == pool.spec.child.network:
        return None
    return (f"child.network is {pool.spec.child.network} but its ForkParent has spec.network: {net}; "
            f"set both to the same value")


def plan_orphans(children: Sequence[ChildState], now: float) -> list[Action]:
    """Children of a deleted pool: unclaimed ones go; claimed ones stay until they expire (or the user kills them)."""
    kids = split_children(children, None, now)
    pool = children[0].pool if children else None
    return (_retire(pool, kids.dead, "dead") + _retire(pool, kids.expired, "expired")
            + _retire(pool, kids.idle_old + kids.other, "orphaned"))


def plan_snapshots(snaps: dict[str, SnapshotState], desired_tags: set[str], actual: Actual) -> list[Action]:
    """Collect reconciler-built snapshots that are neither desired nor used by any child (nor being written, nor
    the parent of another snapshot: nothing referenced is deleted)."""
    used = {c.snapshot for c in actual.children} | {s.parent_tag for s in snaps.values() if s.parent_tag}
    return [DeleteSnapshot(tag, "unused") for tag, s in sorted(snaps.items())
            if s.owner is not None and s.status != "writing" and tag not in desired_tags and tag not in used]


def plan(desired: Desired, actual: Actual) -> list[Action]:
    now = actual.now
    failures = failures_by_key(actual)
    blocked = {k for k, f in failures.items() if now < f.retry_at} | set(actual.in_flight)
    snaps = snapshots_by_tag(actual)
    parents = unique_by_name(desired.parents)
    parent_names = {p.metadata.name for p in parents}
    branches = [b for b in unique_by_name(desired.branches) if b.metadata.name not in parent_names]
    taken = parent_names | {b.metadata.name for b in branches}
    layers = [la for la in unique_by_name(desired.layers) if la.metadata.name not in taken]
    tags = resolve_tags(parents, layers, branches)
    by_pool = children_by_pool(actual)
    p50s = dict(actual.spawn_p50_ms)

    actions: list[Action] = []
    for p in parents:
        actions += plan_parent(p, tags[p.metadata.name], snaps)
    for b in branches:
        actions += plan_branch(b, tags[b.metadata.name], snaps, actual.children)
    for la in layers:
        if la.metadata.name in tags:
            actions += plan_layer(la, tags[la.metadata.name], tags[la.spec.from_], snaps)
    pools = unique_by_name(desired.pools)
    in_use = set(tags.values())
    for pool in pools:
        name = pool.metadata.name
        actions += plan_compaction(pool, tags, snaps, p50s.get(name))
        target = pool_target(pool, tags, snaps)
        if target:
            in_use.add(target)
        actions += plan_pool(pool, target, snaps, by_pool.get(name, []), now,
                             may_spawn=f"ForkPool/{name}" not in blocked
                             and network_mismatch(pool, parents, layers) is None)
    pool_names = {pool.metadata.name for pool in pools}
    for name in sorted(set(by_pool) - pool_names):
        actions += plan_orphans(by_pool[name], now)
    actions += plan_snapshots(snaps, in_use, actual)

    # Back-off and in-flight apply to every action by its key; one broken object never blocks the others.
    out: list[Action] = []
    seen: set[str] = set()
    for a in actions:
        if a.key not in blocked and a.key not in seen:
            seen.add(a.key)
            out.append(a)
    return out
