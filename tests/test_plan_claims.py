"""plan() and compute_status() for ForkClaim and namespaces, as tables over plain values: no VMs, no disk, no
clock (the shared world: tests/plan_world.py)."""
from __future__ import annotations

import pytest

from forkd.reconciler.actions import (
    BuildParent,
    ClaimChildren,
    ForgetClaim,
    SpawnChildren,
)
from forkd.reconciler.plan import plan
from forkd.reconciler.state import Actual, ClaimRecord, Desired
from forkd.reconciler.status import compute_status
from forkd.reconciler.world import parent_tag, resolve
from forkd.spec.models import ForkBranch, ForkClaim, ForkLayer, ForkParent
from tests.plan_world import NOW, PY, TAG, conds, kids, pool, retired, snap, world


# -- ForkClaim ------------------------------------------------------------------------------------------------
def claim(name: str = "c1", **spec) -> ForkClaim:
    spec.setdefault("pool", "agents")
    return ForkClaim(metadata={"name": name, "creationTimestamp": "2027-01-15T07:00:00Z"}, spec=spec)


def claim_world(claims=(), records=(), children=(), **kw):
    d, a = world(pools=(pool(2, child={"ttlSeconds": 600}),), snapshots=(snap(),), children=children, **kw)
    return (Desired(parents=d.parents, pools=d.pools, claims=tuple(claims)),
            Actual(snapshots=a.snapshots, children=a.children, failures=a.failures, now=NOW, in_flight=a.in_flight,
                   claims=tuple(records)))


def rec(name="c1", ids=("agents-x-0",), expires=None, uid="2027-01-15T07:00:00Z") -> ClaimRecord:
    return ClaimRecord(name, tuple(ids), NOW - 60, expires, uid)


@pytest.mark.parametrize("spec, ttl, shutdown", [
    ({}, 600.0, None),  # the pool's child.ttlSeconds, as `forkd claim` has it
    ({"ttl": "5m"}, 300.0, None),
    ({"shutdownTime": "2027-01-15T09:00:00Z"}, None, NOW + 3600),
])
def test_claim_is_planned_once_with_its_expiry(spec, ttl, shutdown):
    warm = kids(2)
    d, a = claim_world(claims=(claim(count=2, **spec),), children=warm)
    assert [x for x in plan(d, a) if isinstance(x, ClaimChildren)] == [ClaimChildren("c1", "agents", 2, None, ttl,
                                                                                     shutdown)]
    st = compute_status(d, a, previous={})["ForkClaim/c1"]
    assert conds(st)["Ready"] == ("False", "WaitingForPool") and st.children == []
    # claimed: nothing more to do; status lists the children and how to reach them
    held = kids(2, claimed=True, claimed_at=NOW - 60, agent_socket="/run/x/agent.sock")
    d, a = claim_world(claims=(claim(count=2, **spec),), children=held, records=(rec(ids=[c.id for c in held]),))
    assert not [x for x in plan(d, a) if not isinstance(x, SpawnChildren)]
    st = compute_status(d, a, previous={})["ForkClaim/c1"]
    assert conds(st)["Ready"] == ("True", "Claimed") and conds(st)["Expired"] == ("False", "AsExpected")
    assert [(c.id, c.status, c.agentSocket) for c in st.children] == [(c.id, "running", "/run/x/agent.sock")
                                                                      for c in held]
    assert st.claimed == 2


def test_claim_waits_for_a_ready_pool_and_stalls_on_a_missing_one():
    d, a = claim_world(claims=(claim(pool="nope"), claim("c2", **{"from": "nobranch"})))
    assert not [x for x in plan(d, a) if isinstance(x, ClaimChildren)]
    st = compute_status(d, a, previous={})
    assert conds(st["ForkClaim/c1"])["Stalled"] == ("True", "PoolNotFound")
    assert conds(st["ForkClaim/c2"])["Stalled"] == ("True", "BranchNotFound")
    d, a = world(pools=(pool(2),), snapshots=(snap(status="writing"),))
    d = Desired(parents=d.parents, pools=d.pools, claims=(claim(),))
    assert not [x for x in plan(d, a) if isinstance(x, ClaimChildren)]  # the pool's snapshot is not ready yet


def test_expired_claim_retires_its_children_and_says_expired():
    held = kids(2, claimed=True, claimed_at=NOW - 60)
    d, a = claim_world(claims=(claim(),), children=held, records=(rec(ids=[c.id for c in held], expires=NOW - 1),))
    assert retired(plan(d, a), "expired") == [c.id for c in held]
    st = compute_status(d, a, previous={})["ForkClaim/c1"]
    assert conds(st)["Expired"] == ("True", "Expired") and conds(st)["Ready"] == ("False", "Expired")
    # a shutdownTime already past: never claimed
    d, a = claim_world(claims=(claim(shutdownTime="2027-01-15T07:59:00Z"),), children=kids(2))
    assert not [x for x in plan(d, a) if isinstance(x, ClaimChildren)]
    assert conds(compute_status(d, a, previous={})["ForkClaim/c1"])["Expired"][0] == "True"


def test_deleted_claim_retires_its_children_then_forgets_them():
    held = kids(2, claimed=True, claimed_at=NOW - 60)
    d, a = claim_world(children=held, records=(rec(ids=[c.id for c in held]),))
    actions = plan(d, a)
    assert retired(actions, "claim-deleted") == [c.id for c in held]
    assert ForgetClaim("c1") not in actions
    d, a = claim_world(records=(rec(ids=[c.id for c in held]),))  # children gone
    assert ForgetClaim("c1") in plan(d, a)
    # the same name applied again is another claim: the old one's children go first, then it claims
    d, a = claim_world(claims=(claim(),), children=held, records=(rec(ids=[c.id for c in held], uid="old"),))
    actions = plan(d, a)
    assert retired(actions, "claim-deleted") and not [x for x in actions if isinstance(x, ClaimChildren)]
    assert conds(compute_status(d, a, previous={})["ForkClaim/c1"])["Reconciling"] == ("True", "ReleasingPrevious")


def test_claim_spec_rules():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="not both"):
        claim(ttl="5m", shutdownTime="2027-01-15T09:00:00Z")
    with pytest.raises(pydantic.ValidationError):
        claim(ttl="5 minutes")
    with pytest.raises(pydantic.ValidationError, match="time zone"):
        claim(shutdownTime="2027-01-15T09:00:00")
    with pytest.raises(pydantic.ValidationError):
        claim(count=0)


def test_pool_status_carries_the_scale_subresource_fields():
    d, a = world(pools=(pool(2),), snapshots=(snap(),), children=kids(2))
    st = compute_status(d, a, previous={})["ForkPool/agents"]
    assert (st.replicas, st.selector) == (2, "forkd.dev/pool=agents")


# -- namespaces -----------------------------------------------------------------------------------------------
def in_ns(obj, ns: str):
    return obj.model_copy(update={"metadata": obj.metadata.model_copy(update={"namespace": ns})})


def test_the_same_names_in_two_namespaces_plan_apart():
    """One parent and one pool named alike in "default" and "team-a": two builds with different tags, two spawns
    into differently named pools; "default" keeps today's names."""
    a_py, a_pool = in_ns(PY, "team-a"), in_ns(pool(1), "team-a")
    a_tag = parent_tag(in_ns(PY, "team-a").model_copy(update={"metadata": PY.metadata.model_copy(
        update={"name": "team-a.py", "namespace": "team-a"})}))
    assert a_tag.startswith("team-a.py-") and a_tag != TAG
    d, a = world(parents=(PY, a_py), pools=(pool(1), a_pool))
    actions = plan(d, a)
    assert [(x.parent, x.tag) for x in actions if isinstance(x, BuildParent)] == [("py", TAG), ("team-a.py", a_tag)]
    d, a = world(parents=(PY, a_py), pools=(pool(1), a_pool), snapshots=(snap(), snap(a_tag, owner="team-a.py")))
    assert [(x.pool, x.tag, x.count) for x in plan(d, a) if isinstance(x, SpawnChildren)] == [
        ("agents", TAG, 1), ("team-a.agents", a_tag, 1)]
    # a child of "team-a.agents" is not a child of "agents": each pool is full with its own
    children = kids(1) + kids(1, tag=a_tag, pool="team-a.agents")
    d, a = world(parents=(PY, a_py), pools=(pool(1), a_pool), snapshots=(snap(), snap(a_tag, owner="team-a.py")),
                 children=children)
    assert plan(d, a) == []


@pytest.mark.parametrize("refs, stuck", [
    # (namespace of the parent, of the layer, of the pool) -> what cannot resolve: references stay in a namespace
    (("team-a", "team-a", "team-a"), set()),
    (("default", "team-a", "team-a"), {"ForkLayer/team-a.lay", "ForkPool/team-a.agents"}),
    (("team-a", "team-a", "team-b"), {"ForkPool/team-b.agents"}),
    (("default", "default", "default"), set()),
])
def test_references_resolve_within_the_namespace(refs, stuck):
    p_ns, l_ns, pool_ns = refs
    layer = in_ns(ForkLayer(metadata={"name": "lay"}, spec={"from": "py", "run": ["true"]}), l_ns)
    d, a = world(parents=(in_ns(PY, p_ns),), layers=(layer,), pools=(in_ns(pool(1, src="lay"), pool_ns),))
    w = resolve(d, a)
    assert set(w.stuck) == stuck


def test_a_claim_and_a_branch_name_their_pool_in_their_namespace():
    a_pool, d_pool = in_ns(pool(1), "team-a"), pool(1)
    c = in_ns(claim(), "team-a")
    br = in_ns(ForkBranch(metadata={"name": "b"}, spec={"sandbox": "pool/agents"}), "team-a")
    w = resolve(Desired(parents=(PY, in_ns(PY, "team-a")), pools=(d_pool, a_pool), claims=(c,), branches=(br,)),
                Actual(children=kids(1, pool="agents", claimed=True), now=NOW))
    assert [x.spec.pool for x in w.claims] == ["team-a.agents"]
    assert "ForkClaim/team-a.c1" not in w.stuck
    assert "b" not in w.sources and "team-a.b" not in w.sources  # the claimed child is default's, not team-a's
    assert "ForkBranch/team-a.b" in w.stuck


def test_long_qualified_names_still_make_valid_tags():
    from forkd.base.names import check_tag

    ns, name = "n" * 63, "p" * 52
    obj = in_ns(ForkParent(metadata={"name": name}, spec={}), ns)
    d, a = world(parents=(obj,))
    (build,) = plan(d, a)
    assert build.parent == f"{ns}.{name}" and check_tag(build.tag) == build.tag
