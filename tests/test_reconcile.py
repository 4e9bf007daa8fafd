"""The reconciler over the fake VMM driver (tests/fake_vmm.py; it passes the driver contract tests): apply a parent
and a pool, keep the pool at target through deaths, scaling, claims and a change of the parent's warm-up; dry runs,
diff and bad documents change nothing. What only a real VM shows is tested with QEMU elsewhere (test_fork, ...)."""

from __future__ import annotations

import os
import time

import pytest

from forkd.base.errors import Conflict
from forkd.base.procs import start_time
from forkd.reconciler.control import Control
from forkd.reconciler.world import parent_tag
from forkd.spec.loader import load_text
from tests.conftest import forkd_cli
from tests.fake_vmm import on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {{name: rp}}
spec:
  memoryMiB: 256
  warmup: {{imports: [json], exec: ["MARK = {mark!r}"]}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: rpool}}
spec: {{from: rp, warm: {warm}, maxChildren: 8, child: {{ttlSeconds: {ttl}}}}}
"""


def objs(warm: int = 3, mark: str = "v1", ttl: int = 600):
    loaded, errors = load_text(SPEC.format(warm=warm, mark=mark, ttl=ttl), "test.yaml")
    assert not errors, errors
    return [(x.obj, f"{x.file}:{x.line}") for x in loaded]


@pytest.fixture(scope="module")
def control(rt):
    c = Control(rt)
    yield c
    for kind, name in (("ForkPool", "rpool"), ("ForkParent", "rp")):
        try:
            c.delete(kind, name)
        except Exception:  # noqa: BLE001 - already gone
            pass
    c.reconciler.run_until_converged(60)
    left = [r.id for r in rt.children() if r.pool == "rpool"]
    if left:
        rt.kill(left)
    c.reconciler.close()


def converge(control, timeout=180):
    ok, problems = control.reconciler.run_until_converged(timeout)
    assert ok, problems


def pool_children(rt, claimed=None):
    return [r for r in rt.children() if r.pool == "rpool" and r.status == "running"
            and (claimed is None or r.claimed == claimed)]


def test_apply_parent_and_pool_becomes_ready_with_three_warm(rt, control):
    changes = control.apply(objs(warm=3), "test")
    assert [(c.kind, c.change, c.generation) for c in changes] == [("ForkParent", "created", 1),
                                                                  ("ForkPool", "created", 1)]
    converge(control)
    idle = pool_children(rt, claimed=False)
    assert len(idle) == 3
    for r in idle:  # warm, answering, and from the parent's warm-up
        assert rt.eval(r.id, "MARK")["value"] == "'v1'"
    pool = control.get("ForkPool", "rpool")[0]
    assert pool.status.warm == 3 and pool.status.condition("Ready").status == "True"
    assert pool.status.observedGeneration == 1


def test_reapply_same_spec_changes_nothing_and_generation_stays(rt, control):
    changes = control.apply(objs(warm=3), "test")
    assert {c.change for c in changes} == {"unchanged"}
    assert control.get("ForkPool", "rpool")[0].metadata.generation == 1


def test_killed_child_is_replaced(rt, control):
    victim = pool_children(rt, claimed=False)[0]
    os.kill(victim.pid, 9)
    while start_time(victim.pid) is not None:
        time.sleep(0.02)
    converge(control)
    ids = {r.id for r in pool_children(rt, claimed=False)}
    assert len(ids) == 3 and victim.id not in ids
    assert victim.id not in {r.id for r in rt.children()}  # its record was cleaned up too


def test_scale_up_and_down(rt, control):
    control.apply(objs(warm=5), "test")
    assert control.get("ForkPool", "rpool")[0].metadata.generation == 2
    converge(control)
    assert len(pool_children(rt, claimed=False)) == 5
    before = {r.id for r in pool_children(rt)}
    control.apply(objs(warm=2), "test")
    converge(control)
    after = {r.id for r in pool_children(rt, claimed=False)}
    assert len(after) == 2 and after <= before  # scaled down, nobody new


def test_claim_hands_out_and_pool_refills(rt, control):
    control.apply(objs(warm=3), "test")
    converge(control)
    got = control.claim("rpool", 2)
    assert len(got) == 2 and all(r.claimed and r.expires_at for r in got)
    for r in got:
        assert rt.ping(r.id)["child_id"] == r.id
    converge(control)
    assert len(pool_children(rt, claimed=False)) == 3
    claimed_ids = {r.id for r in pool_children(rt, claimed=True)}
    assert {r.id for r in got} <= claimed_ids


def test_a_claim_past_max_children_is_refused_and_gives_its_warm_back(rt, control):
    converge(control)
    live = [r for r in rt.children() if r.pool == "rpool" and r.status in ("running", "starting")]
    idle = {r.id for r in pool_children(rt, claimed=False)}
    room = 8 - len(live)  # maxChildren 8
    assert idle and room > 0
    with pytest.raises(Conflict) as exc:
        control.claim("rpool", len(idle) + room + 1)
    assert f"maxChildren (8) leaves room for {room}" in exc.value.message
    assert f"claim at most {len(idle) + room}" in exc.value.hint
    assert {r.id for r in pool_children(rt, claimed=False)} == idle  # the warm ones taken were given back
    got = control.claim("rpool", len(idle) + room)  # exactly up to the cap: the rest forked on the spot
    try:
        assert len(got) == len(idle) + room and all(r.claimed for r in got)
        assert len([r for r in rt.children() if r.pool == "rpool" and r.status == "running"]) == 8
    finally:
        rt.kill([r.id for r in got])


def test_dry_run_and_diff_change_nothing(rt, control):
    before = control.get("ForkPool", "rpool")[0]
    changes = control.apply(objs(warm=4), "test", dry_run=True)
    assert [(c.kind, c.change) for c in changes] == [("ForkParent", "unchanged"), ("ForkPool", "configured")]
    diffs = control.diff(objs(warm=4))
    assert [ref for ref, _ in diffs] == ["ForkPool/rpool"] and "+warm: 4" in diffs[0][1]
    after = control.get("ForkPool", "rpool")[0]
    assert after.metadata.generation == before.metadata.generation and after.spec.warm == 3


def test_cli_diff_and_bad_document_apply_nothing(rt, control, tmp_path):
    good = tmp_path / "pool.yaml"
    good.write_text(SPEC.format(warm=3, mark="v1", ttl=600))
    env = {"FORKD_NO_DAEMON": "1"}
    os.environ.update(env)
    try:
        assert forkd_cli("diff", "-f", str(good)).returncode == 0
        good.write_text(SPEC.format(warm=6, mark="v1", ttl=600))
        res = forkd_cli("diff", "-f", str(good))
        assert res.returncode == 1 and "+warm: 6" in res.stdout
        bad = tmp_path / "bad.yaml"
        bad.write_text("apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\nmetadata: {name: other}\n"
                       "spec:\n  from: rp\n  warm: -1\n  replicas: 3\n")
        res = forkd_cli("apply", "-f", str(good), "-f", str(bad))
        assert res.returncode == 2
        assert f"{bad}:6:" in res.stderr and "spec.warm" in res.stderr
        assert f"{bad}:7:" in res.stderr and "replicas" in res.stderr
        assert control.get("ForkPool", "rpool")[0].spec.warm == 3  # the good file was not applied either
        assert forkd_cli("get", "pools", "other").returncode == 3
    finally:
        os.environ.pop("FORKD_NO_DAEMON")


def test_changed_warmup_rolls_the_pool_and_collects_the_old_snapshot(rt, control):
    old_tag = parent_tag(control.get("ForkParent", "rp")[0])
    claimed = {r.id for r in pool_children(rt, claimed=True)}
    control.apply(objs(warm=3, mark="v2"), "test")
    new_tag = parent_tag(control.get("ForkParent", "rp")[0])
    assert new_tag != old_tag
    converge(control, timeout=240)
    idle = pool_children(rt, claimed=False)
    assert len(idle) == 3 and {r.snapshot for r in idle} == {new_tag}
    assert rt.eval(idle[0].id, "MARK")["value"] == "'v2'"
    # claimed children were left alone, so the old snapshot is still there for them
    assert claimed <= {r.id for r in pool_children(rt, claimed=True)}
    assert rt.store.get(old_tag).status == "ready"
    rt.kill(sorted(claimed))
    converge(control)
    with pytest.raises(Exception, match="no snapshot"):
        rt.store.get(old_tag)


def test_claimed_child_is_retired_when_its_ttl_ends(rt, control):
    control.apply(objs(warm=3, mark="v2", ttl=1), "test")
    converge(control)
    (c,) = control.claim("rpool", 1)
    assert c.expires_at is not None and c.expires_at - c.claimed_at == pytest.approx(1, abs=0.01)
    time.sleep(1.5)
    converge(control)
    assert c.id not in {r.id for r in rt.children()}
    assert len(pool_children(rt, claimed=False)) == 3


def test_a_request_the_spec_refuses_is_a_terminal_failure(tmp_path):
    """The executor records a TerminalError as a failure it does not retry (its event says so, `converged` reports
    the object at once); any other failure is retried after a back-off."""
    from forkd.base.paths import Layout
    from forkd.core.runtime import Runtime
    from forkd.reconciler.actions import RetireChild, SpawnChildren

    control = Control(Runtime(Layout(tmp_path / "home")))
    loaded, errors = load_text("apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\nmetadata: {name: tp}\n"
                               "spec: {from: rp}\n", "tp.yaml")
    assert not errors
    control.apply([(x.obj, "tp.yaml") for x in loaded], "test")
    rec = control.reconciler
    try:
        rec._run(SpawnChildren("tp", "rp 0!", 1))  # a tag the request refuses (a count over maxChildren is capped)
        f = rec.failures["ForkPool/tp"]
        assert f.terminal and f.action == SpawnChildren("tp", "rp 0!", 1) and "invalid Spawn: tag" in f.message
        event = control.describe("ForkPool", "tp")["events"][-1]
        assert event["reason"] == "Failed" and event["message"].endswith("(not retried until the spec changes)")
        rec._run(RetireChild("tp", "no-such-child", "dead"))  # NotFound: retryable
        f = rec.failures["child/no-such-child"]
        assert not f.terminal and f.retry_at > time.time()
        rec.step()
        ok, problems = rec.converged([("ForkPool", "tp")])
        assert not ok and problems == ["ForkPool/tp: SourceNotFound: spec.from 'rp' names no ForkParent or "
                                       "ForkLayer"]
    finally:
        rec.close()
