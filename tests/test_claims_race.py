"""Concurrent claims against one pool through a real daemon (issue 15, finding 9), on the fake VMM driver
(tests/fake_vmm.py: what is raced here is the registry, the claims and the reconcile loop, not the VMs).

Eight threads at a time do `Sandbox.create(pool="agents")` (the README's pool: warm 4, maxChildren 16), run a
command and kill their sandbox, while the pool is scaled down and up again (the reconcile loop retires idle
children meanwhile). Every claim must succeed with a child that answers as itself: a child forked on the spot for
a claim is claimed from birth, and nothing retires or removes a child another operation is still creating.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.base.procs import is_alive, start_time
from forkd.core.runtime import Runtime
from forkd.reconciler.actions import RetireChild
from forkd.reconciler.handlers import Context, retire
from forkd.reconciler.objects import ObjectStore
from forkd.sandbox.registry import CLAIMS, RECORD, ChildRecord, Claim, Registry
from forkd.sdk import Sandbox
from tests.conftest import forkd_cli
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {{name: race-base}}
spec: {{memoryMiB: 256, vcpus: 1, warmup: {{imports: [json]}}}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: agents}}
spec: {{from: race-base, warm: {warm}, maxChildren: 16, child: {{network: none, ttlSeconds: 600}}}}
"""
CLAIMERS = 8
ROUNDS = 3


def apply(warm: int) -> None:
    """`forkd apply -f -`: through the daemon while one runs (it owns the home), in-process before."""
    forkd_cli("apply", "-f", "-", input=SPEC.format(warm=warm), check=True)


def pool_children(rt) -> list:
    return [r for r in rt.children() if r.pool == "agents"]


def wait_for(cond, timeout: float = 300, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def warm_idle(rt, n: int) -> bool:
    kids = pool_children(rt)
    idle = [r for r in kids if not r.claimed and r.status == "running"]
    return len(idle) == n and len(kids) == n


@pytest.fixture(scope="module")
def daemon(home, tmp_path_factory, rt):
    apply(4)  # the daemon's loop builds the parent and fills the pool
    d = start_api_daemon(home, tmp_path_factory.mktemp("claims"))
    try:
        wait_for(lambda: warm_idle(rt, 4), 600, "the pool at 4 warm")
        yield d
    finally:
        try:
            for ref in ("pool/agents", "parent/race-base"):
                forkd_cli("delete", ref, check=True)
            wait_for(lambda: not pool_children(rt), 120, "the pool's children retired")
        finally:
            stop_api_daemon(d)
            left = [r.id for r in pool_children(rt)]
            if left:
                rt.kill(left)


def claimer(sock: str, i: int, results: dict, errors: list) -> None:
    try:
        sb = Sandbox.create(pool="agents", socket=sock)
    except Exception as exc:  # noqa: BLE001 - collected and reported by the test
        errors.append(f"claim {i}: {exc!r}")
        return
    try:
        results[i] = (sb.id, sb.commands.run("hostname").stdout.strip())
    except Exception as exc:  # noqa: BLE001
        errors.append(f"exec on {sb.id} (claim {i}): {exc!r}")
    finally:
        try:
            sb.kill()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"kill {sb.id} (claim {i}): {exc!r}")


def test_concurrent_claims_creates_and_kills_against_one_pool(daemon, rt):
    for rnd in range(ROUNDS):
        results: dict[int, tuple[str, str]] = {}
        errors: list[str] = []
        threads = [threading.Thread(target=claimer, args=(daemon.sock, i, results, errors))
                   for i in range(CLAIMERS)]
        for t in threads:
            t.start()
        # meanwhile the pool is scaled down and up: the loop retires idle children while claims fork new ones
        apply(1)
        time.sleep(1.5)
        apply(4)
        for t in threads:
            t.join(600)
        assert not errors, f"round {rnd}: " + "; ".join(errors)
        assert sorted(results) == list(range(CLAIMERS))
        ids = [cid for cid, _ in results.values()]
        assert len(set(ids)) == CLAIMERS, f"a child was handed out twice: {ids}"
        assert all(cid == host for cid, host in results.values()), results  # each answered as itself
        assert not [r.id for r in pool_children(rt) if r.status == "failed"]
        wait_for(lambda: warm_idle(rt, 4), 300, f"the pool back at 4 warm after round {rnd}")


# -- the registry's rules, on records whose "VMM" is a plain process of this test (no VM needed) ----------------
@pytest.fixture
def local(tmp_path):
    """A runtime on an empty home, and a factory of running pool children whose VMM stands in as `sleep`."""
    rt = Runtime(Layout(tmp_path / "home"))
    procs: list[subprocess.Popen] = []

    def child(state: str = "running", pool: str = "p", **kw) -> ChildRecord:
        proc = subprocess.Popen(["sleep", "300"])
        procs.append(proc)
        cid = rt.registry.new_id()
        me = os.getpid()
        return rt.registry.save(ChildRecord(
            id=cid, snapshot="s", created_at=time.time(), dir=str(rt.registry.path(cid)), memory_mib=256, vcpus=1,
            accel="tcg", pid=proc.pid, started=start_time(proc.pid), state=state, pool=pool, spawner_pid=me,
            spawner_started=start_time(me), **kw))

    yield rt, child
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_batch_claim_is_one_appended_line_of_the_claims_log(local):
    rt, child = local
    recs = [child() for _ in range(32)]
    before = {r.id: os.stat(Path(r.dir) / RECORD).st_ino for r in recs}
    got = rt.claim_children("p", 32, ttl_seconds=60)
    assert sorted(r.id for r in got) == sorted(before)
    assert all(r.claimed and r.expires_at == r.claimed_at + 60 for r in got)
    # no record was rewritten: the batch is one line of the log
    assert {r.id: os.stat(Path(r.dir) / RECORD).st_ino for r in recs} == before
    log = rt.layout.children / CLAIMS
    assert len(log.read_bytes().splitlines()) == 1 and log.stat().st_mode & 0o777 == 0o600
    fresh = Registry(rt.layout)  # another process's view
    assert all(r.claimed for r in fresh.list()) and fresh.get(recs[0].id).claimed
    assert rt.claim_children("p", 1) == []  # nothing is handed out twice
    rt.unclaim([r.id for r in got[:2]])
    assert not any(r.claimed for r in fresh.list() if r.id in {got[0].id, got[1].id})  # read incrementally
    assert sorted(r.id for r in rt.claim_children("p", 5)) == sorted(r.id for r in got[:2])
    rt.kill([recs[0].id])
    rt.registry._claims.compact(set(rt.registry._ids()))  # what a log past COMPACT_BYTES gets
    table = Registry(rt.layout).claims()
    assert recs[0].id not in table and set(table) == {r.id for r in recs[1:]}
    assert all(r.claimed for r in fresh.list())  # a rewritten log is read whole again


def test_a_torn_last_line_of_the_claims_log_is_cut_off(local):
    rt, child = local
    a, b = child(), child()
    rt.claim_children("p", 1)
    log = rt.layout.children / CLAIMS
    with open(log, "ab") as f:  # a claimer died mid-write: its claim never reached its caller
        f.write(b'{"c":["' + b.id.encode())
    assert [r.id for r in Registry(rt.layout).list() if r.claimed] == [a.id]  # a half line is not read
    [got] = rt.claim_children("p", 1)
    assert got.id == b.id and all(r.claimed for r in Registry(rt.layout).list())
    assert len(log.read_bytes().splitlines()) == 2


def test_a_child_forked_for_a_claim_is_claimed_from_birth(local):
    rt, child = local
    rec = child(state="starting", claimed_at=Claim.now(60).at)
    assert rec.claimed and rt.claim_children("p", 1) == []


def test_retire_never_takes_a_busy_or_newly_claimed_child(local):
    rt, child = local
    ctx = Context(rt, ObjectStore(rt.layout), {}, claim=lambda pool, n: [])  # this test claims nothing
    starting, idle, dead = child(state="starting"), child(), child()
    os.kill(dead.pid, 9)
    assert retire(ctx, RetireChild("p", starting.id, "scale-down")) == ""  # its spawner (this process) lives
    assert rt.registry.get(starting.id).status == "starting" and is_alive(starting.pid, starting.started)
    [claimed] = rt.claim_children("p", 1)  # claimed after plan() decided to retire it as idle
    assert claimed.id == idle.id
    assert retire(ctx, RetireChild("p", idle.id, "scale-down")) == ""
    assert rt.registry.get(idle.id).claimed and is_alive(idle.pid, idle.started)
    deadline = time.monotonic() + 10
    while rt.registry.get(dead.id).status != "dead":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert retire(ctx, RetireChild("p", dead.id, "dead")).startswith("retired")
    assert dead.id not in [r.id for r in rt.children()]


def test_kill_waits_for_a_child_another_operation_is_starting(local):
    rt, child = local
    rec = child(state="starting")

    def finish_start() -> None:  # the spawner's last write, a moment later
        time.sleep(0.5)
        rt.registry.save(rec.with_(state="running"))

    t = threading.Thread(target=finish_start)
    t.start()
    assert rt.kill([rec.id]) == [(rec.id, True)]
    t.join()
    assert not (rt.layout.children / rec.id).exists() and not is_alive(rec.pid, rec.started)


def test_gc_leaves_a_child_to_its_live_stopper_and_reaps_it_once_the_stopper_is_gone(local):
    rt, child = local
    rec = child()
    stopper = subprocess.Popen(["sleep", "300"])
    try:
        rt.registry.save(rec.with_(state="stopping", stopper_pid=stopper.pid, stopper_started=start_time(stopper.pid)))
        report = rt.gc()
        assert rec.id not in report["reaped"] and is_alive(rec.pid, rec.started)  # the stopper's to finish
        assert rt.registry.get(rec.id).status == "stopping"
    finally:
        stopper.kill()
        stopper.wait()
    assert rt.registry.get(rec.id).status == "dead"  # its stopper died mid-stop
    assert rec.id in rt.gc()["reaped"]
    assert not (rt.layout.children / rec.id).exists()


def test_kill_of_a_child_another_operation_is_stopping_waits_and_leaves_it_to_that_one(local):
    rt, child = local
    rec = child()
    pid, started = os.getpid(), start_time(os.getpid())
    rt.registry.save(rec.with_(state="stopping", stopper_pid=pid, stopper_started=started))
    assert rt.registry.get(rec.id).busy and rt.claim_children("p", 1) == []  # no claim takes it either

    def finish_stop() -> None:  # the other operation (e.g. the reconciler retiring it) finishes
        time.sleep(0.5)
        rt.supervisor.kill(rec)

    t = threading.Thread(target=finish_stop)
    t.start()
    assert rt.kill([rec.id]) == [(rec.id, False)]  # it was not this kill that stopped it
    t.join()
    assert not (rt.layout.children / rec.id).exists()


def test_a_refill_never_forks_past_max_children(local):
    """The reconciler's SpawnChildren re-counts the pool under its lock (forkd.reconciler.poollocks): with the cap
    full it forks nothing (a fork here would fail loudly: the tag names no snapshot)."""
    from forkd.reconciler.actions import SpawnChildren
    from forkd.reconciler.control import Control
    from forkd.reconciler.handlers import spawn
    from forkd.spec.loader import load_text

    rt, child = local
    loaded, errors = load_text("apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\nmetadata: {name: p}\n"
                               "spec: {from: rp, warm: 2, maxChildren: 2}\n", "p.yaml")
    assert not errors
    Control(rt).apply([(x.obj, "p.yaml") for x in loaded], "test")
    child()
    child(claimed_at=Claim.now(60).at)
    ctx = Context(rt, ObjectStore(rt.layout), {}, claim=lambda pool, n: [])
    assert spawn(ctx, SpawnChildren("p", "no-such-snapshot", 3)) == ""
    assert len(rt.children()) == 2
