"""plan(desired, actual) -> actions: the pure heart of the reconciler.

Pure and deterministic: no I/O (an import-linter contract forbids it), no clock (time is `actual.now`), no
randomness; it plans over the World `resolve` makes of its inputs (sorted first), so the same inputs in any tuple
order give the same list in the same order: parents, branches and layers (by name), then per pool (by name) its
compaction, retirements and spawn, then orphaned children (by id), then snapshot deletions (by tag).
Layers are built once their `from` snapshot is ready; a pool whose chain is deeper than `compaction.maxDepth`, or
whose spawn p50 exceeds `spawnLatencyTarget.p50Ms`, gets its chain head compacted into a base it then spawns from.
A ForkBranch snapshots a running child (by id, or the oldest claimed child of `pool/<name>`) once; pools and
layers can then use it as their `from`. A ForkClaim claims its children once (when its pool, or its `from`
branch, has a ready snapshot), and retires them when it expires; a deleted claim's children are retired and its
record then forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from forkd.reconciler.actions import (
    Action,
    BuildBranch,
    BuildLayer,
    BuildParent,
    ClaimChildren,
    CompactSnapshot,
    DeleteSnapshot,
    ForgetClaim,
    RetireChild,
    SpawnChildren,
)
from forkd.reconciler.state import Actual, ChildState, ClaimRecord, Desired
from forkd.reconciler.world import (
    LIVE,
    World,
    chain_depth,
    claim_shutdown,
    claim_ttl,
    compact_tag,
    resolve,
    split_children,
)
from forkd.spec.models import ForkBranch, ForkClaim, ForkLayer, ForkParent, ForkPool, spec_hash


def backoff_seconds(attempts: int) -> float:
    """Delay before retrying an object whose action failed `attempts` times in a row (used by the executor)."""
    return float(min(300, 2 ** min(attempts, 16)))


def compaction_reason(pool: ForkPool, head: str, w: World) -> str | None:
    """Why the pool's chain head should be compacted now (None: it should not)."""
    depth = chain_depth(head, w.snaps)
    if depth == 0:
        return None
    if pool.spec.compaction is not None and depth > pool.spec.compaction.maxDepth:
        return f"chain depth {depth} > maxDepth {pool.spec.compaction.maxDepth}"
    target, p50 = pool.spec.spawnLatencyTarget, w.p50s.get(pool.metadata.name)
    if target is not None and p50 is not None and p50 > target.p50Ms:
        return f"spawn p50 {p50:.0f} ms > target {target.p50Ms} ms at depth {depth}"
    return None


# -- one function per object kind ---------------------------------------------------------------------------
def plan_parent(parent: ForkParent, w: World) -> list[Action]:
    tag = w.tags[parent.metadata.name]
    snap = w.snaps.get(tag)
    if snap is None or snap.status == "failed":  # back-off of a failed build is applied by the caller
        return [BuildParent(parent.metadata.name, tag, spec_hash(parent))]
    return []  # "writing": in progress; "ready": done


def plan_layer(layer: ForkLayer, w: World) -> list[Action]:
    tag = w.tags.get(layer.metadata.name)
    if tag is None:
        return []  # its `from` names nothing it can be built from (status: SourceNotFound)
    from_tag = w.tags[layer.spec.from_]
    if not w.ready(from_tag):
        return []  # waits for its source
    snap = w.snaps.get(tag)
    if snap is None or snap.status == "failed":
        return [BuildLayer(layer.metadata.name, tag, from_tag)]
    return []


def plan_branch(b: ForkBranch, w: World) -> list[Action]:
    tag = w.tags[b.metadata.name]
    snap = w.snaps.get(tag)
    if snap is not None and snap.status != "failed":
        return []  # taken (or being taken): a branch is a one-time snapshot
    src = w.sources.get(b.metadata.name)
    return [BuildBranch(b.metadata.name, src.id, tag, b.spec.mode)] if src else []


def plan_compaction(pool: ForkPool, w: World) -> list[Action]:
    head = w.tags.get(pool.spec.from_)
    if head is None or not w.ready(head):
        return []
    existing = w.snaps.get(compact_tag(head))
    if existing is not None and existing.status != "failed":
        return []  # done or in progress
    reason = compaction_reason(pool, head, w)
    return [CompactSnapshot(pool.metadata.name, head, compact_tag(head), reason)] if reason else []


def _retire(pool: str | None, children: Iterable[ChildState], reason: str) -> list[Action]:
    return [RetireChild(pool, c.id, reason) for c in children]


def plan_pool(pool: ForkPool, w: World) -> list[Action]:
    name, warm, cap = pool.metadata.name, pool.spec.warm, pool.spec.maxChildren
    kids, target = w.kids[name], w.targets[name]
    out = (_retire(name, [c for c in kids.dead if c.status != "oom-killed"], "dead")
           + _retire(name, [c for c in kids.dead if c.status == "oom-killed"], "oom-killed")
           + _retire(name, kids.expired, "expired"))
    if target is None:  # from names a ForkLayer or nothing: only the housekeeping above, no spawn / rollout
        return out
    may_spawn = w.ready(target) and not w.waiting(f"ForkPool/{name}") and name not in w.mismatches
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


def newest_first(children: Sequence[ChildState]) -> list[ChildState]:
    return sorted(children, key=lambda c: (-c.created_at, c.id))


def plan_orphans(children: Sequence[ChildState], now: float) -> list[Action]:
    """Children of a deleted pool: unclaimed ones go; claimed ones stay until they expire (or the user kills them)."""
    kids = split_children(children, None, now)
    pool = children[0].pool if children else None
    return (_retire(pool, kids.dead, "dead") + _retire(pool, kids.expired, "expired")
            + _retire(pool, kids.idle_old + kids.other, "orphaned"))


def _held(rec: ClaimRecord, w: World) -> list[ChildState]:
    """The children a claim record names that are still there (live or not: retiring a dead one removes it)."""
    return [c for cid in rec.children if (c := w.child(cid)) is not None]


def plan_claim(claim: ForkClaim, w: World) -> list[Action]:
    """Claim once; retire the children when the claim expires (the pool's own rules retire dead ones)."""
    name = claim.metadata.name
    rec = w.records.get(name)
    if rec is not None:
        if rec.expires_at is not None and rec.expires_at <= w.now:
            return [RetireChild(c.pool, c.id, "expired") for c in _held(rec, w)]
        return []
    shutdown = claim_shutdown(claim)
    if f"ForkClaim/{name}" in w.stuck or (shutdown is not None and shutdown <= w.now):
        return []  # nothing to claim from, or over before it began (status: Expired)
    if any(r.name == name for r in w.stray_records):
        return []  # the children of an earlier claim of this name are released first
    from_tag = w.tags.get(claim.spec.from_) if claim.spec.from_ else None
    if not w.ready(from_tag if claim.spec.from_ else w.targets.get(claim.spec.pool)):
        return []  # waits for the snapshot it claims from
    return [ClaimChildren(name, claim.spec.pool, claim.spec.count, from_tag,
                          claim_ttl(claim, w.pool(claim.spec.pool)), shutdown)]


def plan_stray_claims(w: World) -> list[Action]:
    """A deleted claim's children are retired; then its record is forgotten."""
    out: list[Action] = []
    for rec in w.stray_records:
        held = _held(rec, w)
        out += [RetireChild(c.pool, c.id, "claim-deleted") for c in held]
        if not [c for c in held if c.status in LIVE]:
            out.append(ForgetClaim(rec.name))
    return out


def plan_snapshots(w: World) -> list[Action]:
    """Collect reconciler-built snapshots that are neither desired nor used by any child (nor being written, nor
    the parent of another snapshot: nothing referenced is deleted). A snapshot an owned pull installed is kept for
    `w.pull_grace` seconds even so: the operator pulls it before it applies the object it belongs to."""
    desired = set(w.tags.values()) | {t for t in w.targets.values() if t}
    used = {c.snapshot for c in w.children} | {s.parent_tag for s in w.snaps.values() if s.parent_tag}
    return [DeleteSnapshot(tag, "unused") for tag, s in sorted(w.snaps.items())
            if s.owner is not None and s.status != "writing" and tag not in desired and tag not in used
            and not (s.pulled_at is not None and w.now - s.pulled_at < w.pull_grace)]


def plan(desired: Desired, actual: Actual) -> list[Action]:
    return plan_world(resolve(desired, actual))


def plan_world(w: World) -> list[Action]:
    """The actions that move `w` toward its desired state. Back-off and in-flight apply to every action by its key,
    and one broken object never blocks the others."""
    actions: list[Action] = []
    for p in w.parents:
        actions += plan_parent(p, w)
    for b in w.branches:
        actions += plan_branch(b, w)
    for la in w.layers:
        actions += plan_layer(la, w)
    for pool in w.pools:
        actions += plan_compaction(pool, w) + plan_pool(pool, w)
    for children in w.orphans.values():
        actions += plan_orphans(children, w.now)
    for claim in w.claims:
        actions += plan_claim(claim, w)
    actions += plan_stray_claims(w)
    actions += plan_snapshots(w)
    out: list[Action] = []
    seen: set[str] = set()
    for a in actions:
        if a.key not in seen and not w.blocked(a):
            seen.add(a.key)
            out.append(a)
    return out
