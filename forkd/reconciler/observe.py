"""Read the world into the plain values `plan` takes: applied objects -> Desired, snapshots + children -> Actual."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from forkd.reconciler.objects import ObjectStore
from forkd.reconciler.state import Actual, ChildState, Desired, Failure, SnapshotState
from forkd.store.snapshot import Snapshot

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

PARENT_LABEL = "forkd.dev/parent"
LAYER_LABEL = "forkd.dev/layer"
BRANCH_LABEL = "forkd.dev/branch"
POOL_LABEL = "forkd.dev/pool"  # compacted bases: the pool they were compacted for
SPEC_HASH_LABEL = "forkd.dev/spec-hash"
COMPACTED_FROM_LABEL = "forkd.dev/compacted-from"  # set by forkd.core.pipeline.compaction
COMPACTION_REASON_LABEL = "forkd.dev/compaction-reason"


def desired(objects: ObjectStore) -> Desired:
    by_kind: dict[str, list] = {"ForkParent": [], "ForkLayer": [], "ForkPool": [], "ForkBranch": [], "ForkClaim": []}
    for st in objects.list():
        by_kind[st.obj.kind].append(st.obj)
    return Desired(parents=tuple(by_kind["ForkParent"]), layers=tuple(by_kind["ForkLayer"]),
                   pools=tuple(by_kind["ForkPool"]), branches=tuple(by_kind["ForkBranch"]),
                   claims=tuple(by_kind["ForkClaim"]))


def _owner(labels: dict[str, str]) -> str | None:
    for label, kind in ((PARENT_LABEL, "ForkParent"), (LAYER_LABEL, "ForkLayer"), (BRANCH_LABEL, "ForkBranch"),
                        (POOL_LABEL, "ForkPool")):
        if label in labels:
            return f"{kind}/{labels[label]}"
    return None


def actual_snapshots(rt: Runtime) -> list[SnapshotState]:
    out = []
    for s in rt.store.list():
        if isinstance(s, Snapshot):
            out.append(SnapshotState(tag=s.tag, status=s.status, owner=_owner(s.labels),
                                     spec_hash=s.labels.get(SPEC_HASH_LABEL), error=s.error,
                                     created_at=s.created_at, parent_tag=s.parent_tag,
                                     compacted_from=s.labels.get(COMPACTED_FROM_LABEL),
                                     compaction_reason=s.labels.get(COMPACTION_REASON_LABEL)))
    return out


def child_states(rt: Runtime, pool: str | None = None) -> list[ChildState]:
    """Every child as the planner sees it (or those of one pool)."""
    return [ChildState(id=r.id, snapshot=r.snapshot, pool=r.pool, status=r.status, claimed=r.claimed,
                       claimed_at=r.claimed_at, expires_at=r.expires_at, created_at=r.created_at,
                       agent_socket=str(r.agent_socket))
            for r in rt.children() if pool is None or r.pool == pool]


def actual(rt: Runtime, failures: tuple[Failure, ...] = (), in_flight: frozenset[str] = frozenset(),
           spawn_p50_ms: tuple[tuple[str, float], ...] = (), objects: ObjectStore | None = None) -> Actual:
    now = time.time()
    snaps = actual_snapshots(rt)
    return Actual(snapshots=tuple(snaps), children=tuple(child_states(rt)), failures=failures, now=now,
                  in_flight=in_flight, spawn_p50_ms=spawn_p50_ms,
                  claims=tuple(objects.claims()) if objects is not None else ())
