"""After a fault the soak checks that the pool is back at its target (inject.refilled), by progress, not by a
stopwatch: a pool that stops moving short of its target for the stall budget breaks the fault's promise and is
counted so in the report; one that is still spawning is waited for; one whose maxChildren is taken by claimed
children is full, not broken (as the crash harness judges pools, tests/chaos/recovery.py).

No VM: the pools are given as the daemon's API gives them, the children as plain values shaped like the registry's
records, time by a test clock the waits advance. The fault itself is a stand-in that reports every promise held
(what is under test is the refill check and its count in the report, not the injection: that runs for real in
tests/faults/test_home_full_soak.py)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

from forkd.base.paths import Layout
from tests.faults import inject

spec = importlib.util.spec_from_file_location("bench_soak", Path(__file__).resolve().parents[2] / "bench/soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _pool(warm: int, cap: int = 6) -> dict:
    ready = warm == 2
    return {"metadata": {"name": "cx-a"}, "spec": {"warm": 2, "maxChildren": cap},
            "status": {"warm": warm, "conditions": [{"type": "Ready", "status": str(ready),
                                                     "reason": "Ready" if ready else "Scaling",
                                                     "message": f"{warm} of 2 warm children ready"}]}}


def _kid(i: int, status: str = "running", claimed: bool = False) -> SimpleNamespace:
    """A record made just now (a `starting` one is a spawn in flight by its age on the time of day)."""
    return SimpleNamespace(id=f"c{i}", pool="cx-a", status=status, claimed=claimed, created_at=time.time())


def _faults(tmp_path, pools, kids, monkeypatch) -> tuple:
    """The soak's Faults, home_full only, on a pool `pools(t)` gives and children `kids(t)` at test time t."""
    clock = Clock()
    rt = SimpleNamespace(layout=Layout(tmp_path / "home"), registry=SimpleNamespace(list=lambda: kids(clock.t)))
    rig = SimpleNamespace(pools=lambda: [pools(clock.t)])
    monkeypatch.setattr(soak.inject, "home_full", lambda *a: inject.Outcome("home_full", seconds=1.0))
    monkeypatch.setattr(soak, "parent_tag", lambda rt: "cx-p-x")
    f = soak.Faults(rig, rt, api=None, pool="cx-a", every=1, shm=None, kill_daemon=False,
                    pack_file=tmp_path / "p.tar.zst")
    f.kinds, f.clock, f.sleep = ["home_full"], clock, clock.sleep
    return f, clock


def test_a_pool_that_stops_short_of_its_target_after_a_fault_is_a_broken_promise(tmp_path, monkeypatch):
    f, clock = _faults(tmp_path, lambda t: _pool(1), lambda t: [_kid(1)], monkeypatch)
    f.maybe(0)
    [broken] = f.summary()["home_full"]["broken"]
    assert f.summary()["home_full"]["held"] == 0
    assert "not back at their target after the fault (stalled" in broken and "warm 1 of target 2" in broken
    assert "c1 running" in broken  # the pool's children, as the registry has them
    assert inject.REFILL_STALL_S <= clock.t < inject.REFILL_STALL_S + 1  # judged by the stall, not the cap
    res = soak.result(SimpleNamespace(cycles=1, branches=0, failures=0, latency_ms=[1.0]), f,
                      [{"t_min": 0.0, **dict.fromkeys(soak.SERIES, 0.0)}], 60.0)
    assert "fault home_full   injected 1, promise held 0" in soak.text(res)


def test_a_pool_still_spawning_is_waited_for_and_its_refill_holds(tmp_path, monkeypatch):
    def kids(t: float) -> list:  # a child spawning for longer than the stall budget, then running
        return [_kid(1)] + ([_kid(2, "starting")] if t < 2 * inject.REFILL_STALL_S else [_kid(2)])

    f, clock = _faults(tmp_path, lambda t: _pool(1 if t < 2 * inject.REFILL_STALL_S else 2), kids, monkeypatch)
    f.maybe(0)
    assert f.summary()["home_full"] == {"injected": 1, "held": 1, "broken": []}
    assert clock.t >= 2 * inject.REFILL_STALL_S


def test_a_pool_full_of_claimed_children_is_full_not_broken(tmp_path, monkeypatch):
    claimed = [_kid(i, claimed=True) for i in range(3)]
    f, _ = _faults(tmp_path, lambda t: _pool(0, cap=3), lambda t: claimed, monkeypatch)
    f.maybe(0)
    assert f.summary()["home_full"]["held"] == 1
