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
SPEC_HASH_LABEL = "forkd.dev/spec-hash"


def desired(objects: ObjectStore) -> Desired:
    by_kind: dict[str, list] = {"ForkParent": [], "ForkLayer": [], "ForkPool": [], "ForkBranch": []}
    for st in objects.list():
        by_kind[st.obj.kind].append(st.obj)
    return Desired(parents=tuple(by_kind["ForkParent"]), layers=tuple(by_kind["ForkLayer"]),
                   pools=tuple(by_kind["ForkPool"]), branches=tuple(by_kind["ForkBranch"]))


def actual(rt: Runtime, failures: tuple[Failure, ...] = (), in_flight: frozenset[str] = frozenset()) -> Actual:
    now = time.time()
    snaps = []
    for s in rt.store.list():
        if isinstance(s, Snapshot):
            snaps.append(SnapshotState(tag=s.tag, status=s.status, owner=s.labels.get(PARENT_LABEL),
                                       spec_hash=s.labels.get(SPEC_HASH_LABEL), error=s.error,
                                       created_at=s.created_at))
    children = []
    for r in rt.children():
        children.append(ChildState(id=r.id, snapshot=r.snapshot, pool=r.pool, status=r.status, claimed=r.claimed,
                                   claimed_at=r.claimed_at, expires_at=r.expires_at, created_at=r.created_at))
    return Actual(snapshots=tuple(snaps), children=tuple(children), failures=failures, now=now,
                  in_flight=in_flight)
