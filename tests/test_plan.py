"""plan() and compute_status() as tables over plain values: no VMs, no disk, no clock. Parents, pools, layers,
determinism, status and the World; ForkClaim and namespaces are in tests/test_plan_claims.py."""
from __future__ import annotations

import dataclasses
import random

import pytest

from forkd.reconciler.actions import (
    BuildBranch,
    BuildLayer,
    BuildParent,
    CompactSnapshot,
    DeleteSnapshot,
    RetireChild,
    SpawnChildren,
)
from forkd.reconciler.plan import backoff_seconds, plan
from forkd.reconciler.state import Actual, ChildState, Desired, Failure, SnapshotState
from forkd.reconciler.status import compute_status
from forkd.reconciler.world import Stuck, branch_tag, compact_tag, layer_tag, parent_tag, resolve, resolve_tags
from forkd.spec.models import ForkBranch, ForkLayer, ForkParent, spec_hash
from tests.plan_world import BUILD, NOW, PY, PY2, TAG, TAG2, conds, kids, pool, retired, snap, spawns, world


# -- parents --------------------------------------------------------------------------------------------
def test_parent_tag_and_backoff():
    assert TAG == f"py-{spec_hash(PY)[:10]}" and TAG != TAG2
    assert [backoff_seconds(n) for n in (0, 1, 5, 8, 9, 100)] == [1, 2, 32, 256, 300, 300]


@pytest.mark.parametrize("snapshots, failures, in_flight, expected", [
    ((), (), (), [BUILD]),  # missing
    ((snap(status="writing"),), (), (), []),  # in progress
    ((snap(),), (), (), []),  # done
    ((snap(status="failed"),), (), (), [BUILD]),  # failed, no back-off record
    ((snap(status="failed"),), (Failure("ForkParent", "py", "boom", 2, NOW + 4),), (), []),  # back-off pending
    ((snap(status="failed"),), (Failure("ForkParent", "py", "boom", 2, NOW),), (), [BUILD]),
    ((), (), ("ForkParent/py",), []),  # in flight
], ids=["missing", "writing", "ready", "failed", "backoff-pending", "backoff-over", "in-flight"])
def test_parent(snapshots, failures, in_flight, expected):
    assert plan(*world(snapshots=snapshots, failures=failures, in_flight=in_flight)) == expected


def test_one_broken_parent_does_not_block_others():
    other = ForkParent(metadata={"name": "node"})
    d, a = world(parents=(PY, other), failures=(Failure("ForkParent", "py", "boom", 1, NOW + 60),))
    assert plan(d, a) == [BuildParent("node", parent_tag(other), spec_hash(other))]


def test_spec_change_builds_new_tag_keeps_old_snapshot_while_used_then_collects_it():
    old_kids = kids(2)
    d, a = world(parents=(PY2,), pools=(pool(2),), snapshots=(snap(),), children=old_kids)
    acts = plan(d, a)
    assert acts == [BuildParent("py", TAG2, spec_hash(PY2))]  # old idle kept, old snapshot kept (used)
    # new snapshot ready: spawn on it, old idle children still serve claims
    d, a = world(parents=(PY2,), pools=(pool(2),), snapshots=(snap(), snap(TAG2)), children=old_kids)
    assert plan(d, a) == [SpawnChildren("agents", TAG2, 2)]
    # new children up: old ones retired (rollout); old snapshot still referenced by them this round
    d, a = world(parents=(PY2,), pools=(pool(2),), snapshots=(snap(), snap(TAG2)), children=old_kids + kids(2, TAG2))
    assert sorted(retired(plan(d, a), "rollout")) == sorted(c.id for c in old_kids)
    assert not [x for x in plan(d, a) if isinstance(x, DeleteSnapshot)]
    # old children gone: old snapshot collected
    d, a = world(parents=(PY2,), pools=(pool(2),), snapshots=(snap(), snap(TAG2)), children=kids(2, TAG2))
    assert plan(d, a) == [DeleteSnapshot(TAG, "unused")]


@pytest.mark.parametrize("s, collected", [
    (snap("py-0000000000"), True),  # reconciler-built, unused
    (snap("py-0000000000", status="failed"), True),
    (snap("py-0000000000", status="writing"), False),
    (snap("mine", owner=None), False),  # made by hand: never collected
    (snap(status="failed"), False),  # current desired tag: retried, not collected
    (dataclasses.replace(snap("py-0000000000"), pulled_at=NOW - 5), False),  # pulled, its object not applied yet
    (dataclasses.replace(snap("py-0000000000"), pulled_at=NOW - 61), True),  # pulled, grace over: collected
], ids=["unused", "failed-unused", "writing", "hand-made", "failed-desired", "pulled-in-grace", "pulled-grace-over"])
def test_snapshot_gc(s, collected):
    d, a = world(snapshots=(snap(), s) if s.tag != TAG else (s,))
    assert (DeleteSnapshot(s.tag, "unused") in plan(d, a)) is collected


@pytest.mark.parametrize("grace, collected", [(60.0, False), (4.0, True), (0.0, True)])
def test_a_pulled_snapshots_grace_is_the_one_actual_carries(grace, collected):
    pulled = dataclasses.replace(snap("py-0000000000"), pulled_at=NOW - 5)
    d, a = world(snapshots=(snap(), pulled))
    a = dataclasses.replace(a, pull_grace=grace)
    assert (DeleteSnapshot(pulled.tag, "unused") in plan(d, a)) is collected


def test_snapshot_used_by_a_hand_forked_or_claimed_child_is_kept():
    old = snap("py-0000000000")
    for child in (kids(1, old.tag, pool=None), kids(1, old.tag, claimed=True), kids(1, old.tag, status="dead")):
        d, a = world(snapshots=(snap(), old), children=child)
        assert DeleteSnapshot(old.tag, "unused") not in plan(d, a)


# -- pools ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("warm, have, spawn, retire", [
    (3, 0, 3, []),
    (5, 3, 2, []),
    (2, 5, 0, [f"agents-{TAG}-{i}" for i in (4, 3, 2)]),  # newest first
    (3, 3, 0, []),
], ids=["0->3", "3->5", "5->2", "steady"])
def test_pool_scaling(warm, have, spawn, retire):
    d, a = world(pools=(pool(warm),), snapshots=(snap(),), children=kids(have))
    acts = plan(d, a)
    assert spawns(acts) == ([(TAG, spawn)] if spawn else [])
    assert retired(acts, "scale-down") == retire


def test_dead_child_retired_and_replaced():
    children = kids(2) + kids(1, start=2, status="dead") + kids(1, start=3, status="failed")
    acts = plan(*world(pools=(pool(3),), snapshots=(snap(),), children=children))
    assert retired(acts, "dead") == [f"agents-{TAG}-2", f"agents-{TAG}-3"]
    assert spawns(acts) == [(TAG, 1)]


def test_claimed_untouched_by_scale_down_and_rollout():
    claimed = kids(3, claimed=True, start=10) + kids(2, TAG, claimed=True, start=20)
    d, a = world(pools=(pool(1),), snapshots=(snap(),), children=claimed + kids(3))
    acts = plan(d, a)
    assert len(retired(acts, "scale-down")) == 2 and not set(retired(acts)) & {c.id for c in claimed}
    # rollout: claimed on the old tag stay, idle old ones go once the new tag has enough
    d, a = world(parents=(PY2,), pools=(pool(1),), snapshots=(snap(), snap(TAG2)),
                 children=claimed + kids(2) + kids(1, TAG2))
    acts = plan(d, a)
    assert retired(acts, "rollout") == [f"agents-{TAG}-1", f"agents-{TAG}-0"] and not spawns(acts)


def test_rollout_spawns_on_new_tag_keeps_old_until_enough():
    d, a = world(parents=(PY2,), pools=(pool(3),), snapshots=(snap(), snap(TAG2)), children=kids(3) + kids(1, TAG2))
    acts = plan(d, a)
    assert spawns(acts) == [(TAG2, 2)] and not retired(acts)
    d, a = world(parents=(PY2,), pools=(pool(3),), snapshots=(snap(), snap(TAG2)), children=kids(3) + kids(3, TAG2))
    acts = plan(d, a)
    assert len(retired(acts, "rollout")) == 3 and not spawns(acts)


def test_target_not_ready_keeps_old_idle_no_spawn_trims_excess():
    d, a = world(parents=(PY2,), pools=(pool(2),), snapshots=(snap(), snap(TAG2, "writing")), children=kids(4))
    acts = plan(d, a)
    assert not spawns(acts) and retired(acts, "scale-down") == [f"agents-{TAG}-3", f"agents-{TAG}-2"]


def test_max_children_caps_spawn():
    children = kids(4, claimed=True)
    acts = plan(*world(pools=(pool(3, maxChildren=5),), snapshots=(snap(),), children=children))
    assert spawns(acts) == [(TAG, 1)]
    acts = plan(*world(pools=(pool(3, maxChildren=4),), snapshots=(snap(),), children=children))
    assert spawns(acts) == []


def test_max_children_full_of_old_idle_children_swaps_rather_than_stalls():
    d, a = world(parents=(PY2,), pools=(pool(3, maxChildren=3),), snapshots=(snap(), snap(TAG2)), children=kids(3))
    acts = plan(d, a)
    assert len(retired(acts, "rollout")) == 3 and spawns(acts) == [(TAG2, 3)]


def test_expired_claimed_retired():
    children = (ChildState("a", TAG, "agents", "running", claimed=True, expires_at=NOW),
                ChildState("b", TAG, "agents", "running", claimed=True, expires_at=NOW + 1),
                ChildState("c", TAG, "agents", "running", claimed=True))
    acts = plan(*world(pools=(pool(0),), snapshots=(snap(),), children=children))
    assert acts == [RetireChild("agents", "a", "expired")]


def test_deleted_pool_retires_unclaimed_keeps_claimed():
    children = kids(2, pool="gone") + kids(1, pool="gone", start=5, claimed=True) + \
        kids(1, pool="gone", start=6, claimed=True, expires_at=NOW - 1) + kids(1, pool=None, start=7)
    acts = plan(*world(snapshots=(snap(),), children=children))
    assert retired(acts, "orphaned") == [f"gone-{TAG}-0", f"gone-{TAG}-1"]
    assert retired(acts, "expired") == [f"gone-{TAG}-6"]
    assert len(retired(acts)) == 3  # claimed (unexpired) and hand-forked children are left alone


def test_pool_in_flight_or_backing_off_suppresses_spawn_only():
    children = kids(1, status="dead")
    for kw in ({"in_flight": ("ForkPool/agents",)}, {"failures": (Failure("ForkPool", "agents", "x", 1, NOW + 2),)}):
        acts = plan(*world(pools=(pool(3),), snapshots=(snap(),), children=children, **kw))
        assert not spawns(acts) and retired(acts, "dead") == [children[0].id]
    acts = plan(*world(pools=(pool(3),), snapshots=(snap(),), children=children,
                       in_flight=(f"child/{children[0].id}",)))
    assert not retired(acts) and spawns(acts) == [(TAG, 3)]


def test_isolated_pool_spawns_only_from_an_isolated_parent():
    # the parent has no NIC: children could not have one, so the pool never spawns (status: NetworkMismatch)
    acts = plan(*world(pools=(pool(3, child={"network": "isolated"}),), snapshots=(snap(),)))
    assert acts == []
    iso = ForkParent(metadata={"name": "py"}, spec={"warmup": {"imports": ["json"]}, "network": "isolated"})
    tag = parent_tag(iso)
    acts = plan(*world(parents=(iso,), pools=(pool(3, child={"network": "isolated", "memoryLimitMiB": 256}),),
                       snapshots=(snap(tag),)))
    assert spawns(acts) == [(tag, 3)]
    # and a parent with a NIC never feeds a pool of unisolated children
    acts = plan(*world(parents=(iso,), pools=(pool(3),), snapshots=(snap(tag),)))
    assert not spawns(acts)


def test_oom_killed_children_are_retired_and_shown():
    children = kids(1, status="oom-killed") + kids(1, start=1)
    acts = plan(*world(pools=(pool(2),), snapshots=(snap(),), children=children))
    assert retired(acts, "oom-killed") == [children[0].id] and spawns(acts) == [(TAG, 1)]
    st = compute_status(*world(pools=(pool(2),), snapshots=(snap(),), children=children), previous={})
    assert conds(st["ForkPool/agents"])["Degraded"] == ("True", "ChildOOMKilled")
    assert children[0].id in st["ForkPool/agents"].condition("Degraded").message


@pytest.mark.parametrize("layers, src", [((ForkLayer(metadata={"name": "lay"}, spec={"from": "nope"}),), "lay"),
                                         ((), "nothing")], ids=["unresolved-layer", "unknown"])
def test_pool_from_unknown_source_spawns_nothing(layers, src):
    children = kids(1, status="dead") + kids(1, start=1) + kids(1, start=2, claimed=True, expires_at=NOW)
    acts = plan(*world(pools=(pool(3, src=src),), snapshots=(snap(),), children=children, layers=layers))
    assert not spawns(acts) and retired(acts) == [children[0].id, children[2].id]  # housekeeping only


LAY = ForkLayer(metadata={"name": "lay"}, spec={"from": "py", "run": ["echo x"]})
LAY2 = ForkLayer(metadata={"name": "lay2"}, spec={"from": "lay", "imports": ["csv"]})


def test_layers_build_in_chain_order_and_pools_spawn_from_the_head():
    t1 = layer_tag(LAY, TAG)
    t2 = layer_tag(LAY2, t1)
    # nothing built yet: only the first layer can start (its source is ready); the second waits
    acts = plan(*world(layers=(LAY2, LAY), pools=(pool(2, src="lay2"),), snapshots=(snap(),)))
    assert [a for a in acts if isinstance(a, BuildLayer)] == [BuildLayer("lay", t1, TAG)]
    assert not spawns(acts)
    acts = plan(*world(layers=(LAY, LAY2), pools=(pool(2, src="lay2"),),
                       snapshots=(snap(), SnapshotState(t1, "ready", owner="ForkLayer/lay", parent_tag=TAG))))
    assert [a for a in acts if isinstance(a, BuildLayer)] == [BuildLayer("lay2", t2, t1)]
    acts = plan(*world(layers=(LAY, LAY2), pools=(pool(2, src="lay2"),),
                       snapshots=(snap(), SnapshotState(t1, "ready", owner="x", parent_tag=TAG),
                                  SnapshotState(t2, "ready", owner="x", parent_tag=t1))))
    assert spawns(acts) == [(t2, 2)]
    # a changed parent spec moves every tag down the chain
    assert layer_tag(LAY, TAG2) != t1


def test_a_layer_with_children_or_dependents_is_not_collected():
    t1 = layer_tag(LAY, TAG)
    snaps = (snap(), SnapshotState(t1, "ready", owner="x", parent_tag=TAG),
             SnapshotState("orphan-layer", "ready", owner="x", parent_tag=t1))
    acts = plan(*world(layers=(), snapshots=snaps))
    # t1 is no longer desired but "orphan-layer" is built on it: only the leaf goes first
    assert [a.tag for a in acts if isinstance(a, DeleteSnapshot)] == ["orphan-layer"]


def chain_snaps(depth):
    snaps, parent = [snap()], TAG
    layers = []
    for i in range(depth):
        la = ForkLayer(metadata={"name": f"l{i}"}, spec={"from": parent_name(i), "run": [f"echo {i}"]})
        layers.append(la)
    tags = resolve_tags([PY], layers)
    for la in layers:
        snaps.append(SnapshotState(tags[la.metadata.name], "ready", owner="x", parent_tag=parent))
        parent = tags[la.metadata.name]
    return layers, snaps, parent


def parent_name(i):
    return "py" if i == 0 else f"l{i - 1}"


def test_compaction_fires_on_depth_and_on_latency_and_the_pool_moves_to_the_base():
    layers, snaps, head = chain_snaps(4)
    deep = pool(2, src="l3", compaction={"maxDepth": 3})
    acts = plan(*world(layers=layers, pools=(deep,), snapshots=snaps))
    comp = [a for a in acts if isinstance(a, CompactSnapshot)]
    assert comp == [CompactSnapshot("agents", head, compact_tag(head), "chain depth 4 > maxDepth 3")]
    assert spawns(acts) == [(head, 2)]  # keeps serving from the head meanwhile
    shallow = pool(2, src="l3", compaction={"maxDepth": 5}, spawnLatencyTarget={"p50Ms": 100})
    d, a = world(layers=layers, pools=(shallow,), snapshots=snaps)
    assert not [x for x in plan(d, a) if isinstance(x, CompactSnapshot)]
    a = Actual(**{**a.__dict__, "spawn_p50_ms": (("agents", 250.0),)})
    assert [x.reason for x in plan(d, a) if isinstance(x, CompactSnapshot)] == [
        "spawn p50 250 ms > target 100 ms at depth 4"]
    # once the compacted base is ready the pool spawns from it (depth 0) and nothing referenced is deleted
    done = snaps + [SnapshotState(compact_tag(head), "ready", owner="x", compacted_from=head,
                                  compaction_reason="chain depth 4 > maxDepth 3")]
    d, a = world(layers=layers, pools=(deep,), snapshots=done)
    acts = plan(d, a)
    assert spawns(acts) == [(compact_tag(head), 2)] and not [x for x in acts if isinstance(x, CompactSnapshot)]
    assert not [x for x in acts if isinstance(x, DeleteSnapshot)]
    st = compute_status(d, a, previous={})["ForkPool/agents"]
    assert st.chainDepth == 0 and st.snapshot == compact_tag(head)
    assert f"compacted {head} into {compact_tag(head)} (chain depth 4 > maxDepth 3)" in st.lastCompaction


# -- determinism ----------------------------------------------------------------------------------------
def big_world():
    parents = [ForkParent(metadata={"name": f"p{i}"}, spec={"vcpus": 1 + i % 3}) for i in range(5)] + [PY2]
    pools = [pool(i % 4 + 1, name=f"pool{i}", src=f"p{i % 6}" if i % 6 < 5 else "py", maxChildren=5)
             for i in range(12)]
    snapshots = [snap(parent_tag(p), ["ready", "writing", "failed"][i % 3], p.metadata.name)
                 for i, p in enumerate(parents)] + [snap(), snap("py-old0000000"), snap("hand", owner=None)]
    children = [c for i in range(12) for c in kids(i % 5, parent_tag(parents[i % 6]), pool=f"pool{i}",
                                                    claimed=i % 3 == 0)]
    children += list(kids(3, pool="pool1")) + list(kids(2, pool="deleted", start=4)) + list(kids(2, status="dead"))
    return parents, pools, snapshots, children


def test_plan_is_deterministic_whatever_the_input_order():
    parents, pools, snapshots, children = big_world()
    failures = [Failure("ForkParent", "p2", "boom", 3, NOW + 8)]
    ref = plan(*world(parents, pools, snapshots, children, failures))
    assert ref == plan(*world(parents, pools, snapshots, children, failures))
    assert {type(a) for a in ref} == {BuildParent, SpawnChildren, RetireChild, DeleteSnapshot}
    rnd = random.Random(7)
    for _ in range(10):
        for xs in (parents, pools, snapshots, children):
            rnd.shuffle(xs)
        assert plan(*world(parents, pools, snapshots, children, failures)) == ref
    keys = [a.key for a in ref]
    assert len(keys) == len(set(keys))


# -- status ---------------------------------------------------------------------------------------------
def test_status_parent_ready_building_failed():
    st = compute_status(*world(snapshots=(snap(),)), previous={})["ForkParent/py"]
    assert conds(st) == {"Ready": ("True", "SnapshotReady"), "Reconciling": ("False", "SnapshotReady"),
                         "Degraded": ("False", "AsExpected"), "Stalled": ("False", "AsExpected")}
    assert st.snapshot == TAG and st.specHash == spec_hash(PY) and st.observedGeneration == 0
    st = compute_status(*world(snapshots=(snap(status="writing"),)), previous={})["ForkParent/py"]
    assert conds(st)["Reconciling"] == ("True", "Building") and conds(st)["Ready"][0] == "False"
    d, a = world(snapshots=(snap(status="failed"),), failures=(Failure("ForkParent", "py", "qemu died", 2, NOW + 4),))
    st = compute_status(d, a, previous={})["ForkParent/py"]
    assert conds(st)["Degraded"] == ("True", "BuildFailed") and conds(st)["Reconciling"] == ("False", "BackingOff")
    msg = st.condition("Degraded").message
    assert "qemu died" in msg and "next retry at 2027-01-15T08:00:04Z" in msg


def test_status_pool_ready_reconciling_degraded():
    layer = ForkLayer(metadata={"name": "lay"}, spec={"from": "py"})
    branch = ForkBranch(metadata={"name": "b"}, spec={"sandbox": "x"})
    pools = (pool(2), pool(3, name="scaling"), pool(1, name="nosrc", src="nope"), pool(1, name="lay", src="lay"),
             pool(1, name="iso", child={"network": "isolated"}), pool(1, name="wait", src="p9"))
    d, a = world(parents=(PY, ForkParent(metadata={"name": "p9"})), pools=pools, snapshots=(snap(),),
                 children=kids(2) + kids(1, claimed=True, start=5) + kids(1, pool="scaling"), layers=(layer,),
                 failures=(Failure("ForkPool", "scaling", "no memory", 1, NOW + 2),))
    d = Desired(parents=d.parents, pools=d.pools, layers=d.layers, branches=(branch,))
    st = compute_status(d, a, previous={})
    ok = st["ForkPool/agents"]
    assert conds(ok)["Ready"] == ("True", "WarmPoolReady") and conds(ok)["Reconciling"][0] == "False"
    assert (ok.warm, ok.claimed, ok.target, ok.snapshot, ok.chainDepth) == (2, 1, 2, TAG, 0)
    assert conds(st["ForkPool/scaling"]) == {"Ready": ("False", "Scaling"), "Reconciling": ("True", "Scaling"),
                                             "Degraded": ("True", "SpawnFailed"),
                                             "Stalled": ("False", "AsExpected")}  # retried: not stalled
    assert conds(st["ForkPool/nosrc"])["Degraded"] == ("True", "SourceNotFound")
    assert conds(st["ForkPool/nosrc"])["Stalled"] == ("True", "SourceNotFound")
    assert conds(st["ForkPool/iso"])["Stalled"] == ("True", "NetworkMismatch")
    assert conds(st["ForkBranch/b"])["Stalled"] == ("True", "SandboxNotFound")
    assert conds(st["ForkPool/lay"])["Reconciling"] == ("True", "WaitingForSnapshot")  # the layer is not built yet
    assert conds(st["ForkPool/iso"])["Degraded"] == ("True", "NetworkMismatch")
    assert "spec.network: none" in st["ForkPool/iso"].condition("Degraded").message
    assert conds(st["ForkPool/wait"])["Reconciling"] == ("True", "WaitingForSnapshot")
    assert conds(st["ForkLayer/lay"])["Reconciling"] == ("True", "Building")
    assert conds(st["ForkBranch/b"])["Degraded"] == ("True", "SandboxNotFound")  # no running child "x"


def test_status_rolling_out_and_observed_generation():
    d, a = world(parents=(PY2,), pools=(pool(2),), snapshots=(snap(), snap(TAG2)), children=kids(2))
    st = compute_status(d, a, previous={})
    assert conds(st["ForkPool/agents"])["Reconciling"] == ("True", "RollingOut")
    assert st["ForkParent/py"].observedGeneration == 2


def test_status_last_transition_time_carried_over_only_while_unchanged():
    d, a = world(snapshots=(snap(status="writing"),))
    first = compute_status(d, a, previous={})
    assert {c.lastTransitionTime for c in first["ForkParent/py"].conditions} == {"2027-01-15T08:00:00Z"}
    d, a = world(snapshots=(snap(),))
    a = Actual(snapshots=a.snapshots, now=NOW + 90)
    second = compute_status(d, a, previous=first)["ForkParent/py"]
    assert second.condition("Ready").lastTransitionTime == "2027-01-15T08:01:30Z"  # False -> True
    assert second.condition("Reconciling").lastTransitionTime == "2027-01-15T08:01:30Z"  # True -> False
    assert second.condition("Degraded").lastTransitionTime == "2027-01-15T08:00:00Z"  # False all along
    assert compute_status(d, a, previous={"ForkParent/py": None})["ForkParent/py"] \
        .condition("Degraded").lastTransitionTime == "2027-01-15T08:01:30Z"


def test_branch_of_a_claimed_pool_child_is_taken_once_and_can_feed_a_pool():
    b = ForkBranch(metadata={"name": "step7"}, spec={"sandbox": "pool/agents", "mode": "live"})
    children = kids(1, start=0) + kids(2, claimed=True, start=1)
    d, a = world(pools=(pool(1),), snapshots=(snap(),), children=children)
    d = Desired(parents=d.parents, pools=d.pools + (pool(1, name="from-branch", src="step7"),), branches=(b,))
    acts = plan(d, a)
    oldest_claimed = children[1]
    assert [x for x in acts if isinstance(x, BuildBranch)] == [
        BuildBranch("step7", oldest_claimed.id, branch_tag(b), "live")]
    assert not [x for x in spawns(acts) if x[0] == branch_tag(b)]  # the pool waits for the branch
    done = Actual(**{**a.__dict__, "snapshots": a.snapshots + (SnapshotState(branch_tag(b), "ready", owner="x"),)})
    acts = plan(d, done)
    assert not [x for x in acts if isinstance(x, BuildBranch)]  # taken once
    assert (branch_tag(b), 1) in spawns(acts)
    st = compute_status(d, done, previous={})["ForkBranch/step7"]
    assert st.condition("Ready").status == "True" and st.snapshot == branch_tag(b)


# -- one World per pass ---------------------------------------------------------------------------------
def test_one_world_holds_every_rule_plan_status_and_claims_share():
    """A name a ForkParent holds is not a ForkBranch's nor a ForkLayer's; duplicates of a kind: the smallest spec
    hash wins. plan, status and the claim target (World.targets) all read the same resolution."""
    twin_branch = ForkBranch(metadata={"name": "py"}, spec={"sandbox": "x"})
    twin_layer = ForkLayer(metadata={"name": "py"}, spec={"from": "py"})
    other = ForkParent(metadata={"name": "py"}, spec={"vcpus": 2})
    winner = min((PY, other), key=spec_hash)
    d = Desired(parents=(other, PY), layers=(twin_layer,), pools=(pool(1),), branches=(twin_branch,))
    a = Actual(snapshots=(snap(parent_tag(winner)),), now=NOW)
    w = resolve(d, a)
    assert w.parents == (winner,) and w.branches == () and w.layers == ()
    assert w.tags == {"py": parent_tag(winner)} and w.targets == {"agents": parent_tag(winner)}
    assert plan(d, a) == [SpawnChildren("agents", parent_tag(winner), 1)]
    assert set(compute_status(d, a, previous={})) == {"ForkParent/py", "ForkPool/agents"}
    assert w == resolve(Desired(parents=(PY, other), layers=(twin_layer,), pools=(pool(1),),
                                branches=(twin_branch,)), a)


def test_world_knows_what_is_stuck_until_the_spec_changes():
    lost = ForkLayer(metadata={"name": "lost"}, spec={"from": "nope"})
    b = ForkBranch(metadata={"name": "b"}, spec={"sandbox": "x"})
    d = Desired(parents=(PY,), layers=(lost,), pools=(pool(1, src="lost"), pool(1, name="ok")), branches=(b,))
    w = resolve(d, Actual(snapshots=(snap(),), now=NOW))
    assert w.stuck == {
        "ForkLayer/lost": Stuck("SourceNotFound", "spec.from 'nope' names no ForkParent or ForkLayer (or the "
                                                  "layers form a cycle)"),
        "ForkPool/agents": Stuck("SourceNotFound", "spec.from 'lost' names no ForkParent or ForkLayer it can be "
                                                   "built from"),
        "ForkBranch/b": Stuck("SandboxNotFound", "spec.sandbox 'x': no running child of this id in namespace default "
                                                 "(children of other namespaces are never branched); name a running "
                                                 "child of namespace default by id, or pool/<name> of one of its "
                                                 "ForkPools")}
    assert w.terminal == frozenset(w.stuck)
    st = compute_status(d, Actual(snapshots=(snap(),), now=NOW), previous={})
    for key, stuck in w.stuck.items():
        deg = st[key].condition("Degraded")
        assert (deg.status, deg.reason, deg.message) == ("True", stuck.reason, stuck.message)
    # the sandbox appears: the branch is no longer stuck
    w = resolve(d, Actual(snapshots=(snap(),), children=(ChildState("x", TAG, None, "running"),), now=NOW))
    assert "ForkBranch/b" not in w.stuck and w.sources["b"].id == "x"


def test_a_terminal_failure_is_not_retried_until_the_spec_changes():
    failed = Failure("ForkParent", "py", "refused", 1, NOW - 600, terminal=True, action=BUILD)
    d, a = world(failures=(failed,))
    assert plan(d, a) == []  # long past any back-off: still not retried
    assert "ForkParent/py" in resolve(d, a).terminal
    st = compute_status(d, a, previous={})["ForkParent/py"]
    assert conds(st) == {"Ready": ("False", "BuildFailed"), "Reconciling": ("False", "BuildFailed"),
                         "Degraded": ("True", "BuildFailed"), "Stalled": ("True", "BuildFailed")}
    assert st.condition("Degraded").message == "refused (attempt 1; not retried until the spec changes)"
    # a new spec is a new action: it runs (and the old failure no longer holds it back)
    d2, a2 = world(parents=(PY2,), failures=(failed,))
    assert plan(d2, a2) == [BuildParent("py", TAG2, spec_hash(PY2))]
    # a layer's too: not reconciling, Degraded with the reason
    build = BuildLayer("lay", layer_tag(LAY, TAG), TAG)
    d, a = world(layers=(LAY,), snapshots=(snap(),),
                 failures=(Failure("ForkLayer", "lay", "refused", 1, NOW - 600, terminal=True, action=build),))
    assert not [x for x in plan(d, a) if isinstance(x, BuildLayer)]
    assert conds(compute_status(d, a, previous={})["ForkLayer/lay"]) == {
        "Ready": ("False", "BuildFailed"), "Reconciling": ("False", "BuildFailed"), "Degraded": ("True", "BuildFailed"),
        "Stalled": ("True", "BuildFailed")}
    # in flight with the new action: not reported as terminal
    assert "ForkParent/py" not in resolve(*world(parents=(PY2,), failures=(failed,), in_flight=("ForkParent/py",)))\
        .terminal


def test_every_action_type_has_a_handler():
    from typing import get_args

    from forkd.reconciler.actions import Action
    from forkd.reconciler.handlers import HANDLERS

    assert set(HANDLERS) == set(get_args(Action))
    slow = {t.__name__ for t, h in HANDLERS.items() if h.slow}
    assert slow == {"BuildParent", "BuildLayer", "BuildBranch", "CompactSnapshot", "SpawnChildren", "ClaimChildren"}
