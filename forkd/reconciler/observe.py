"""Read the world into the plain values `plan` takes: applied objects -> Desired, snapshots + children -> Actual."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from forkd.base import clock
from forkd.base.settings import settings
from forkd.reconciler.objects import ObjectStore
from forkd.reconciler.state import Actual, ChildState, ClaimRecord, Desired, Failure, SnapshotState
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
PULLED_AT_LABEL = "forkd.dev/pulled-at"  # set by forkd.core.pack on an owned pull (time of day, seconds)


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
                                     compaction_reason=s.labels.get(COMPACTION_REASON_LABEL),
                                     pulled_at=_seconds(s.labels.get(PULLED_AT_LABEL))))
    return out


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def child_states(rt: Runtime, pool: str | None = None, now: float | None = None,
                 boot: float | None = None) -> list[ChildState]:
    """Every child as the planner sees it (or those of one pool). A claim's end is projected from its
    CLOCK_BOOTTIME deadline onto the time of day as it reads `now` (forkd.base.clock.project), so plan() compares
    it with `now` and a stepped clock moves neither."""
    now, boot = (clock.wall(), clock.elapsed()) if now is None or boot is None else (now, boot)
    return [ChildState(id=r.id, snapshot=r.snapshot, pool=r.pool, status=r.status, claimed=r.claimed,
                       claimed_at=r.claimed_at, expires_at=clock.project(r.expires_at, r.expires_boot, now, boot),
                       created_at=r.created_at, agent_socket=str(r.agent_socket))
            for r in rt.children() if pool is None or r.pool == pool]


def claim_records(objects: ObjectStore, now: float, boot: float) -> tuple[ClaimRecord, ...]:
    """The ForkClaims' records, their ends projected onto the time of day as it reads `now` (as child_states)."""
    return tuple(dataclasses.replace(r, expires_at=clock.project(r.expires_at, r.expires_boot, now, boot))
                 for r in objects.claims())


def actual(rt: Runtime, failures: tuple[Failure, ...] = (), in_flight: frozenset[str] = frozenset(),
           spawn_p50_ms: tuple[tuple[str, float], ...] = (), objects: ObjectStore | None = None) -> Actual:
    now, boot = clock.wall(), clock.elapsed()
    snaps = actual_snapshots(rt)
    return Actual(snapshots=tuple(snaps), children=tuple(child_states(rt, None, now, boot)), failures=failures,
                  now=now, in_flight=in_flight, spawn_p50_ms=spawn_p50_ms,
                  claims=claim_records(objects, now, boot) if objects is not None else (),
                  pull_grace=settings().pull_grace)
