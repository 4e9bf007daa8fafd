#!/usr/bin/env python3
"""Reconciler planning benchmark: plan() and compute_status() over 1,000 objects, no VMs.

    python3 bench/plan.py [--runs 20]

The world: 100 ForkParents (a tenth mid-rollout to a new spec, a few builds writing or failed), 900 ForkPools
(warm 0-5, from a parent) with ~3 children each (idle, claimed, some dead or expired, some on an old tag), plus
orphans of deleted pools and unused snapshots. Prints p50/p90 over the runs; the target for plan() is <= 50 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.reconciler.plan import plan  # noqa: E402
from forkd.reconciler.state import Actual, ChildState, Desired, Failure, SnapshotState  # noqa: E402
from forkd.reconciler.status import compute_status  # noqa: E402
from forkd.reconciler.world import parent_tag  # noqa: E402
from forkd.spec.models import ForkParent, ForkPool  # noqa: E402

NOW = 1_800_000_000.0
TARGET_MS = 50.0


def world(n_parents: int = 100, n_pools: int = 900, seed: int = 1) -> tuple[Desired, Actual]:
    rnd = random.Random(seed)
    parents, snaps, children, failures = [], [], [], []
    for i in range(n_parents):
        p = ForkParent(metadata={"name": f"parent-{i}"}, spec={"memoryMiB": 256 + 64 * (i % 4),
                                                                "warmup": {"imports": ["json", "decimal"][: i % 3]}})
        parents.append(p)
        status = "writing" if i % 25 == 3 else "failed" if i % 25 == 7 else "ready"
        snaps.append(SnapshotState(parent_tag(p), status, owner=p.metadata.name, created_at=NOW - 100))
        if i % 10 == 0:  # mid-rollout: an older snapshot still used by children
            snaps.append(SnapshotState(f"parent-{i}-old{i:07d}", "ready", owner=p.metadata.name, created_at=NOW - 9e3))
        if status == "failed":
            failures.append(Failure("ForkParent", p.metadata.name, "qemu exited 1", 2, NOW + rnd.choice((-1, 4))))
    snaps += [SnapshotState(f"gone-{i}-0000000000", "ready", owner=f"gone-{i}") for i in range(20)]
    snaps += [SnapshotState(f"hand-{i}", "ready") for i in range(20)]
    pools = []
    for j in range(n_pools):
        i = j % n_parents
        name = f"pool-{j}"
        pools.append(ForkPool(metadata={"name": name}, spec={"from": f"parent-{i}", "warm": rnd.randint(0, 5),
                                                             "maxChildren": rnd.choice((4, 8, 64))}))
        tag = parent_tag(parents[i]) if i % 10 else f"parent-{i}-old{i:07d}"
        for k in range(rnd.randint(1, 5)):
            claimed = rnd.random() < 0.3
            children.append(ChildState(
                id=f"{name}-c{k}", snapshot=tag, pool=name, claimed=claimed,
                status=rnd.choice(("running",) * 8 + ("starting", "dead")),
                expires_at=NOW + rnd.choice((-5, 600)) if claimed else None, created_at=NOW - rnd.random() * 1e3))
    children += [ChildState(f"orphan-{k}", parent_tag(parents[0]), "deleted", "running") for k in range(30)]
    rnd.shuffle(children)
    in_flight = frozenset(f"ForkPool/pool-{j}" for j in range(0, n_pools, 37))
    return (Desired(parents=tuple(parents), pools=tuple(pools)),
            Actual(tuple(snaps), tuple(children), tuple(failures), NOW, in_flight))


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    runs = ap.parse_args().runs
    desired, actual = world()
    actions = plan(desired, actual)
    assert plan(desired, actual) == actions, "plan() is not deterministic"
    kinds: dict[str, int] = {}
    for a in actions:
        kinds[type(a).__name__] = kinds.get(type(a).__name__, 0) + 1
    n_obj = len(desired.parents) + len(desired.pools)
    print(f"objects: {n_obj} ({len(desired.parents)} parents, {len(desired.pools)} pools), "
          f"{len(actual.children)} children, {len(actual.snapshots)} snapshots")
    print(f"actions: {len(actions)} " + " ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    p = timed(lambda: plan(desired, actual), runs)
    s = timed(lambda: compute_status(desired, actual, {}), runs)
    print(f"plan():           p50 {pct(p, 50):6.1f} ms  p90 {pct(p, 90):6.1f} ms  over {runs} runs "
          f"(target <= {TARGET_MS:.0f} ms: {'ok' if pct(p, 50) <= TARGET_MS else 'MISSED'})")
    print(f"compute_status(): p50 {pct(s, 50):6.1f} ms  p90 {pct(s, 90):6.1f} ms  over {runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
