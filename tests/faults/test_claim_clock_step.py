"""The host clock stepped while pool claims and ForkClaims run: a claim's ttl or `shutdown_at` must end no child
early when the time of day jumps forward, and keep none longer when it jumps back, also across a daemon restart.

What the reconciler compares is read as it reads it: forkd.reconciler.observe (what plan() is given),
still_retirable (what the retirement re-checks under the registry lock) and the claims log as a fresh process
(a restarted daemon) reads it. The clocks are stepped through forkd.base.clock (why not for real:
tests/faults/test_clock_step.py). Each pool child's "VMM" is a real process of this test (`sleep`)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from forkd.base import clock
from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.core.runtime import Runtime
from forkd.reconciler import handlers, observe
from forkd.reconciler.actions import ClaimChildren
from forkd.reconciler.handlers import Context, still_retirable
from forkd.reconciler.objects import ObjectStore
from forkd.reconciler.world import split_children
from forkd.sandbox.claims import CLAIMS, Claim, ClaimsLog, line
from forkd.sandbox.registry import ChildRecord
from forkd.spec.loader import load_text
from tests.faults.test_clock_step import DAY, _step

pytestmark = pytest.mark.faults
TTL = 600.0


@pytest.fixture
def pool(tmp_path):
    """(home, make): make() saves a running, idle child of pool `p` whose VMM is a `sleep` of this test."""
    home = tmp_path / "home"
    rt = Runtime(Layout(home))
    procs: list[subprocess.Popen] = []

    def make() -> ChildRecord:
        proc = subprocess.Popen(["sleep", "300"])
        procs.append(proc)
        cid, me = rt.registry.new_id(), os.getpid()
        return rt.registry.save(ChildRecord(
            id=cid, snapshot="s", created_at=time.time(), dir=str(rt.registry.path(cid)), memory_mib=256, vcpus=1,
            accel="tcg", pid=proc.pid, started=start_time(proc.pid), state="running", pool="p", spawner_pid=me,
            spawner_started=start_time(me)))

    yield home, make
    for proc in procs:
        proc.kill()
        proc.wait()


def _expired(rt: Runtime) -> list[str]:
    """The claimed children the reconciler would retire as expired now (plan()'s split of what observe reads)."""
    act = observe.actual(rt)
    return [c.id for c in split_children(act.children, None, act.now).expired]


def _retirable(rt: Runtime, cid: str) -> bool:
    return still_retirable(rt.child(cid), "expired", clock.wall(), clock.elapsed())


def test_a_clock_stepped_forward_expires_no_pool_claim_early(pool, monkeypatch):
    home, make = pool
    rt = Runtime(Layout(home))
    cid = make().id
    assert [r.id for r in rt.claim_children("p", 1, ttl_seconds=TTL)] == [cid]
    _step(monkeypatch, wall=DAY)  # a day later by the time of day, a moment later in truth
    assert _expired(rt) == []
    assert not _retirable(rt, cid)


def test_a_clock_stepped_back_keeps_no_pool_claim_longer(pool, monkeypatch):
    home, make = pool
    rt = Runtime(Layout(home))
    cid = make().id
    rt.claim_children("p", 1, ttl_seconds=TTL)
    _step(monkeypatch, wall=-DAY, elapsed=TTL + 1)  # its ttl passed, though the time of day went back a day
    assert _expired(rt) == [cid]
    assert _retirable(rt, cid)


def test_a_claims_ttl_survives_a_daemon_restart_on_its_boottime_end(pool, monkeypatch):
    home, make = pool
    cid = make().id
    Runtime(Layout(home)).claim_children("p", 1, ttl_seconds=TTL)
    _step(monkeypatch, wall=DAY, elapsed=TTL - 1)
    assert _expired(Runtime(Layout(home))) == []  # a new process reads the claims log afresh
    _step(monkeypatch, wall=-DAY, elapsed=2)  # now TTL + 1 s in truth, the day stepped back again
    assert _expired(Runtime(Layout(home))) == [cid]


def _forkclaim(home, make, shutdown_in: float) -> tuple[Runtime, ObjectStore, str]:
    """A ForkClaim of one child of pool `p` ending at the time of day `shutdown_in` s from now, claimed by the
    reconciler's handler."""
    rt = Runtime(Layout(home))
    cid = make().id
    store = ObjectStore(rt.layout)
    loaded, errors = load_text("apiVersion: forkd.dev/v1alpha1\nkind: ForkClaim\nmetadata: {name: c1}\n"
                               "spec: {pool: p, count: 1}\n", "claim.yaml")
    assert not errors, errors
    store.put(loaded[0].obj, None, None)
    ctx = Context(rt, store, {}, claim=lambda p, n: rt.claim_children(p, n))
    handlers.claim(ctx, ClaimChildren("c1", "p", 1, None, None, clock.wall() + shutdown_in))
    return rt, store, cid


def test_a_forkclaims_shutdown_at_is_not_brought_forward_by_a_clock_step(pool, monkeypatch):
    home, make = pool
    rt, store, cid = _forkclaim(home, make, TTL)
    _step(monkeypatch, wall=DAY)
    act = observe.actual(rt, objects=store)
    assert [r.expires_at > act.now for r in act.claims] == [True]  # plan_claim retires it only once this passes
    assert _expired(rt) == [] and not _retirable(rt, cid)


def test_a_forkclaims_shutdown_at_is_not_put_off_by_a_clock_step_back(pool, monkeypatch):
    home, make = pool
    rt, store, cid = _forkclaim(home, make, TTL)
    _step(monkeypatch, wall=-DAY, elapsed=TTL + 1)
    act = observe.actual(rt, objects=store)
    assert [r.expires_at <= act.now for r in act.claims] == [True]
    assert _expired(rt) == [cid] and _retirable(rt, cid)


def test_the_claims_log_keeps_the_boottime_end_through_compaction_and_reads_older_lines(tmp_path):
    log = ClaimsLog(tmp_path / CLAIMS)
    log.append(line(["c0000000001"], Claim(100.0, 700.0, 5600.0)), live=lambda: [])
    with log.path.open("a") as f:
        f.write('{"c":["c0000000002"],"at":100.0,"exp":700.0}\n')  # a line of an older forkd
    log.compact({"c0000000001", "c0000000002"})
    table = ClaimsLog(tmp_path / CLAIMS).table()  # read afresh, as a restarted daemon does
    assert table["c0000000001"] == Claim(100.0, 700.0, 5600.0)
    assert table["c0000000002"] == Claim(100.0, 700.0, None)  # compared on the time of day, as it was written
