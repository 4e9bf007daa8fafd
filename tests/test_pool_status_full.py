"""A pool whose maxChildren is taken by claimed children cannot refill: plan() spawns nothing, and its status says
why (MaxChildrenReached, naming the count) instead of an endless "Scaling", so a reader (or the crash harness)
tells a full pool from a stalled reconciler."""

from __future__ import annotations

from forkd.reconciler.plan import plan
from forkd.reconciler.status import compute_status
from tests.plan_world import TAG, conds, kids, pool, snap, spawns, world


def test_a_pool_full_of_claimed_children_says_so_and_spawns_nothing():
    d, a = world(pools=(pool(1, maxChildren=3),), snapshots=(snap(),), children=kids(3, claimed=True))
    assert spawns(plan(d, a)) == []
    st = compute_status(d, a, previous={})["ForkPool/agents"]
    assert conds(st)["Ready"] == ("False", "MaxChildrenReached")
    assert conds(st)["Reconciling"] == ("True", "MaxChildrenReached")
    assert conds(st)["Degraded"] == ("False", "AsExpected")  # nothing is wrong: it refills once one is released
    msg = st.condition("Ready").message
    assert "maxChildren (3)" in msg and "3 claimed" in msg and (st.warm, st.claimed) == (0, 3)


def test_a_pool_with_room_left_is_scaling():
    d, a = world(pools=(pool(1, maxChildren=3),), snapshots=(snap(),), children=kids(2, claimed=True))
    assert spawns(plan(d, a)) == [(TAG, 1)]
    assert conds(compute_status(d, a, previous={})["ForkPool/agents"])["Ready"] == ("False", "Scaling")
