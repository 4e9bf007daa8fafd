"""Diff-snapshot chains with real VMs: what each head's children see, how little a layer stores, tampering and
missing ancestors refused, rmi semantics and compaction."""

from __future__ import annotations

import os

import pytest

from forkd.base.errors import Conflict, ForkdError
from forkd.core.requests import Compaction, LayerBuild, Spawn
from tests.conftest import BASE_TAG, forkd_cli

pytestmark = pytest.mark.vm

LAYERS = [("l1", "one", "csv"), ("l2", "two", "sqlite3"), ("l3", "three", "uuid")]


@pytest.fixture(scope="module")
def chain(rt, base):
    parent = BASE_TAG
    for tag, word, mod in LAYERS:
        rt.snapshot_diff(LayerBuild.of(tag=tag, parent_tag=parent,
                                       run=(f"echo {word} > /root/{tag}.txt",), imports=(mod,)))
        parent = tag
    yield [t for t, _, _ in LAYERS]
    for tag in ("l1",):
        try:
            rt.rmi(tag, cascade=True, force=True)
        except ForkdError:
            pass


def seen(rt, child_id):
    files = rt.exec(child_id, ["sh", "-c", "cat /root/l*.txt 2>/dev/null; true"])["stdout"].split()
    mods = rt.eval(child_id, "sorted(m for m in ('csv', 'sqlite3', 'uuid') if m in globals())")["value"]
    return files, mods


def test_each_head_sees_exactly_its_ancestors(rt, chain, fork):
    expected = [(["one"], "['csv']"), (["one", "two"], "['csv', 'sqlite3']"),
                (["one", "two", "three"], "['csv', 'sqlite3', 'uuid']")]
    (c0,) = fork(1)
    assert seen(rt, c0.id) == ([], "[]")
    for tag, want in zip(chain, expected, strict=True):
        (c,) = fork(1, tag=tag)
        assert seen(rt, c.id) == want, tag
    info = rt.snapshot_info("l3")
    assert info["depth"] == 3 and info["ancestors"] == ["l2", "l1", BASE_TAG] and info["materialized"]
    assert rt.snapshot_info("l1")["dependents"] == ["l2", "l3"]


def test_a_small_layer_stores_a_few_percent(rt, chain):
    for tag in chain:
        snap = rt.store.get(tag)
        assert snap.parent_tag and snap.parent_content_hash == rt.store.get(snap.parent_tag).memory_sha256
        assert 0 < snap.memory_stored_bytes < 0.05 * snap.memory_bytes, (tag, snap.memory_stored_bytes)
        assert not (rt.store.dir(tag) / "memory.bin").exists()  # no full image per link


def test_tampered_layer_is_refused(rt, base):
    rt.snapshot_diff(LayerBuild.of(tag="t1", parent_tag=BASE_TAG, run=("echo x > /root/t1",)))
    rt.snapshot_diff(LayerBuild.of(tag="t2", parent_tag="t1", run=("echo y > /root/t2",)))
    try:
        data = rt.store.dir("t1") / "diff.data"
        os.chmod(data, 0o644)
        with open(data, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        rt.store.flat_path(rt.store.get("t2")).unlink()  # force a rebuild of t2's flat image
        with pytest.raises(ForkdError, match="altered"):
            rt.fork(Spawn.of(tag="t2", n=1))
        assert rt.children() == [c for c in rt.children() if c.snapshot != "t2"]
        # a missing ancestor is named
        rt.rmi("t1", force=True)
        res = forkd_cli("fork", "--tag", "t2")
        assert res.returncode != 0 and "ancestor 't1' is missing" in res.stderr
    finally:
        for t in ("t2", "t1"):
            try:
                rt.rmi(t, force=True)
            except ForkdError:
                pass


def test_rmi_refuses_to_orphan_dependents(rt, chain):
    res = forkd_cli("rmi", "l2")
    assert res.returncode == 4 and "l3" in res.stderr
    with pytest.raises(Conflict, match="dependent layers: l2, l3"):
        rt.rmi("l1")
    assert rt.store.get("l1").status == "ready"


def test_compaction_makes_a_base_that_forks_the_same(rt, chain, fork):
    snap = rt.compact(Compaction.of(from_tag="l3", to_tag="l3-flat"))
    try:
        assert snap.parent_tag is None and snap.memory_sha256 == rt.store.get("l3").memory_sha256
        assert rt.snapshot_info("l3-flat")["depth"] == 0
        (c,) = fork(1, tag="l3-flat")
        assert seen(rt, c.id) == (["one", "two", "three"], "['csv', 'sqlite3', 'uuid']")
        rt.kill([c.id])
    finally:
        rt.rmi("l3-flat", force=True)


def test_cascade_deletes_dependents(rt, base):
    rt.snapshot_diff(LayerBuild.of(tag="k1", parent_tag=BASE_TAG, run=("true",)))
    rt.snapshot_diff(LayerBuild.of(tag="k2", parent_tag="k1", run=("true",)))
    assert rt.rmi("k1", cascade=True) == ["k2", "k1"]
    assert not rt.store.dir("k2").exists() and not rt.store.dir("k1").exists()


LAYERED = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: lp}
spec: {memoryMiB: 256, warmup: {imports: [json]}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkLayer
metadata: {name: la}
spec: {from: lp, run: ["echo a > /root/a"], imports: [csv]}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkLayer
metadata: {name: lb}
spec: {from: la, run: ["echo b > /root/b"]}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: lpool}
spec: {from: lb, warm: 2, compaction: {maxDepth: MAXDEPTH}}
"""


def test_reconciler_builds_layers_and_compacts_while_the_pool_serves(rt):
    import time

    from forkd.reconciler.control import Control
    from forkd.spec.loader import load_text

    control = Control(rt)

    def apply(max_depth):
        loaded, errors = load_text(LAYERED.replace("MAXDEPTH", str(max_depth)), "layered.yaml")
        assert not errors
        control.apply([(x.obj, "layered.yaml") for x in loaded], "layered")

    apply(3)  # depth 2 is within bounds: the pool serves from the chain head
    rec = control.reconciler
    ok, problems = rec.run_until_converged(300)
    assert ok, problems
    head = control.get("ForkPool", "lpool")[0].status.snapshot
    assert rt.store.depth(head) == 2
    (claimed,) = control.claim("lpool", 1)
    apply(1)  # now it is too deep: compaction fires while the pool keeps serving
    serving_during_compaction = []
    deadline = time.monotonic() + 300
    try:
        while True:
            rec.step()
            if any(k.startswith("Compact/") for k in rec.in_flight):
                serving_during_compaction.append(sum(1 for c in rt.children() if c.pool == "lpool"
                                                     and c.status == "running" and not c.claimed))
            ok, problems = rec.converged()
            assert not problems, problems
            pool = control.get("ForkPool", "lpool")[0]
            if ok and pool.status and pool.status.snapshot and pool.status.snapshot.startswith("cmp-"):
                break
            assert time.monotonic() < deadline, control.describe("ForkPool", "lpool")
            rec.wake.wait(0.2)
            rec.wake.clear()
        layer = control.get("ForkLayer", "lb")[0]
        assert layer.status.chainDepth == 2 and layer.status.condition("Ready").status == "True"
        assert pool.status.chainDepth == 0 and "chain depth 2 > maxDepth 1" in pool.status.lastCompaction
        kids = [c for c in rt.children() if c.pool == "lpool" and c.status == "running" and not c.claimed]
        assert len(kids) == 2 and {c.snapshot for c in kids} == {pool.status.snapshot}
        assert rt.exec(kids[0].id, ["cat", "/root/a", "/root/b"])["stdout"] == "a\nb\n"
        assert rt.eval(kids[0].id, "'csv' in globals()")["value"] == "True"
        assert serving_during_compaction and max(serving_during_compaction) > 0
        assert rt.store.get(pool.status.snapshot).labels["forkd.dev/compacted-from"] == head
        assert rt.ping(claimed.id)["child_id"] == claimed.id  # a claimed child on the head is untouched
        assert rt.store.get(head).status == "ready"  # nothing referenced was deleted
    finally:
        for kind, name in (("ForkPool", "lpool"), ("ForkLayer", "lb"), ("ForkLayer", "la"), ("ForkParent", "lp")):
            control.delete(kind, name)
        for _ in range(4):
            rec.step()
        left = [c.id for c in rt.children() if c.pool == "lpool"]
        if left:
            rt.kill(left)
        rec.close()
