"""How the crash harness judges a pool short of its target after a restart (no VM: pools as the daemon's API
gives them, children as plain values shaped like the registry's records).

A pool whose maxChildren is taken by claimed children cannot refill until one is killed
(tests/test_pool_status_full.py): that is the pool's promise, not a violation of it. The harness leaves such
children itself (claims and kills killed mid-way; docs/faults.md), and a replay, starting from a fresh home
without them, does not."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from tests.chaos import recovery
from tests.chaos.invariants import check_pools
from tests.chaos.load import error_text
from tests.chaos.test_gc_build_vmm import private_home  # noqa: F401 - a fixture

NOW = 1_800_000_000.0


def _pool(warm: int, got: int, cap: int = 3, ready: bool = False, reason: str = "Scaling") -> dict:
    return {"metadata": {"name": "cx-i"}, "spec": {"warm": warm, "maxChildren": cap},
            "status": {"warm": got, "conditions": [{"type": "Ready", "status": str(ready), "reason": reason,
                                                    "message": f"{got} of {warm} warm children ready"}]}}


def _kid(i: int, status: str = "running", claimed: bool = False, age: float = 30.0) -> SimpleNamespace:
    return SimpleNamespace(id=f"c{i}", pool="cx-i", status=status, claimed=claimed, created_at=NOW - age)


def test_a_pool_full_of_claimed_children_is_not_a_violation_but_one_with_room_is():
    full = [_kid(1, claimed=True), _kid(2, claimed=True), _kid(3, status="stopping")]
    assert check_pools([_pool(1, 0)], full) == []
    assert check_pools([_pool(1, 0)]) != []  # without the records nothing says it is full
    room = [_kid(1, claimed=True), _kid(2, claimed=True), _kid(3, status="dead", claimed=True)]
    [v] = check_pools([_pool(1, 0)], room, lambda name: [{"time": NOW - 5, "type": "Warning", "reason": "Failed",
                                                          "message": "SpawnChildren: no memory"}])
    assert "warm 0 of target 1" in v and "c1 running claimed" in v and "c3 dead claimed" in v
    assert "Failed: SpawnChildren: no memory" in v and "maxChildren 3" in v


def test_attainable_counts_only_what_no_reconciler_may_remove():
    pool = _pool(2, 0, cap=3)
    assert recovery.attainable(pool, [_kid(1, claimed=True)]) == 2
    assert recovery.attainable(pool, [_kid(1, claimed=True), _kid(2, claimed=True)]) == 1
    assert recovery.attainable(pool, [_kid(1), _kid(2), _kid(3, status="starting")]) == 2  # idle ones: its own
    assert recovery.attainable(pool, [_kid(i, claimed=True) for i in range(5)]) == 0


def test_the_wait_is_a_stall_budget_moving_pools_and_spawns_in_flight_are_progress():
    t = [0.0]
    watch = recovery.Watch(clock=lambda: t[0], wall=lambda: NOW)
    pools = [_pool(1, 0)]
    assert watch.see(pools, [_kid(1, claimed=True)]) == 0.0
    t[0] = 100.0
    assert watch.see(pools, [_kid(1, claimed=True)]) == 100.0  # nothing changed: 100 s without progress
    t[0] = 150.0
    assert watch.see(pools, [_kid(1, claimed=True), _kid(2, status="starting", age=10)]) == 0.0  # a spawn began
    t[0] = 400.0
    assert watch.see(pools, [_kid(1, claimed=True), _kid(2, status="starting", age=260)]) == 0.0  # still spawning
    t[0] = 500.0
    stuck = [_kid(1, claimed=True), _kid(2, status="starting", age=recovery.SPAWN_BOUND_S + 1)]
    assert watch.see(pools, stuck) == 100.0  # a spawn past its own timeouts is no progress: stalled since 400
    t[0] = 800.0
    assert watch.see(pools, stuck) == 400.0


def test_a_failed_commands_error_keeps_the_step_and_the_files():
    res = SimpleNamespace(stderr="error: restore: step 'connect' failed: cannot connect within 30s\n"
                                 + "x" * 9000 + "\nQEMU log: /h/tmp/l/qemu.log; guest console: /h/tmp/l/console.log\n")
    text = error_text(res)
    assert text.startswith("error: restore: step 'connect' failed") and text.endswith("console.log")
    assert len(text) < 4100


def test_a_child_starting_past_any_spawns_timeouts_is_a_violation_though_its_spawner_lives(private_home):  # noqa: F811
    from forkd.base.paths import Layout
    from forkd.base.procs import start_time
    from forkd.core.runtime import Runtime
    from forkd.sandbox.registry import ChildRecord
    from tests.chaos.invariants import check_children

    rt = Runtime(Layout(private_home))
    me = os.getpid()
    for cid, age in (("c0000000001", 10.0), ("c0000000002", recovery.SPAWN_BOUND_S + 60)):
        rt.registry.save(ChildRecord(id=cid, snapshot="s", created_at=time.time() - age, dir="", memory_mib=256,
                                     vcpus=1, accel="tcg", driver="qemu", pool="cx-i", spawner_pid=me,
                                     spawner_started=start_time(me)))
    [v] = check_children(rt, set())
    assert "c0000000002" in v and "has been starting for" in v and f"pid {me}" in v
