"""The plan tables' shared world: a parent, pools, snapshots and children as plain values, at a fixed NOW
(tests/test_plan.py, tests/test_plan_claims.py)."""

from __future__ import annotations

from forkd.reconciler.actions import BuildParent, RetireChild, SpawnChildren
from forkd.reconciler.state import Actual, ChildState, Desired, SnapshotState
from forkd.reconciler.world import parent_tag
from forkd.spec.models import ForkParent, ForkPool, spec_hash

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z

PY = ForkParent(metadata={"name": "py"}, spec={"warmup": {"imports": ["json"]}})
PY2 = ForkParent(metadata={"name": "py", "generation": 2}, spec={"warmup": {"imports": ["json", "decimal"]}})
TAG, TAG2 = parent_tag(PY), parent_tag(PY2)
BUILD = BuildParent("py", TAG, spec_hash(PY))


def pool(warm: int = 3, name: str = "agents", src: str = "py", **spec) -> ForkPool:
    return ForkPool(metadata={"name": name}, spec={"from": src, "warm": warm, **spec})


def snap(tag: str = TAG, status: str = "ready", owner: str | None = "py") -> SnapshotState:
    return SnapshotState(tag=tag, status=status, owner=owner)


def kids(n: int, tag: str = TAG, pool: str | None = "agents", start: int = 0, **kw) -> tuple[ChildState, ...]:
    kw.setdefault("status", "running")
    return tuple(ChildState(id=f"{pool or 'x'}-{tag}-{i}", snapshot=tag, pool=pool, created_at=float(i), **kw)
                 for i in range(start, start + n))


def world(parents=(PY,), pools=(), snapshots=(), children=(), failures=(), in_flight=(), layers=()):
    return (Desired(parents=tuple(parents), pools=tuple(pools), layers=tuple(layers)),
            Actual(snapshots=tuple(snapshots), children=tuple(children), failures=tuple(failures), now=NOW,
                   in_flight=frozenset(in_flight)))


def retired(actions, reason: str | None = None) -> list[str]:
    return [a.child for a in actions if isinstance(a, RetireChild) and reason in (None, a.reason)]


def spawns(actions) -> list[tuple[str, int]]:
    return [(a.tag, a.count) for a in actions if isinstance(a, SpawnChildren)]


def conds(status) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}
