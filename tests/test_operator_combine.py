"""forkd.operator.combine: one Kubernetes status from a resource's statuses on several node daemons (pure;
table-tested)."""

from __future__ import annotations

import pytest

from forkd.operator.combine import LOST, claim_status, pool_status

READY = [{"type": "Ready", "status": "True", "reason": "AsExpected", "message": "", "lastTransitionTime": "t"}]
WAITING = [{"type": "Ready", "status": "False", "reason": "Warming", "message": "1/2 warm", "lastTransitionTime": "t"}]


def test_pool_sums_and_lists_the_split():
    per = {"b": {"warm": 1, "claimed": 2, "replicas": 1, "target": 1, "conditions": READY, "node": "b"},
           "a": {"warm": 2, "claimed": 0, "replicas": 2, "target": 3, "conditions": WAITING}}
    st = pool_status(per, {"a": 3, "b": 1}, 4)
    assert (st["warm"], st["claimed"], st["replicas"], st["target"]) == (3, 2, 3, 4)
    assert st["nodes"] == [{"node": "a", "target": 3, "warm": 2, "claimed": 0},
                           {"node": "b", "target": 1, "warm": 1, "claimed": 2}]
    assert st["conditions"] == WAITING  # not Ready somewhere: not Ready, with that node's reason
    assert "node" not in st


def test_pool_on_one_node_names_it_even_with_a_zero_share_elsewhere():
    per = {"a": {"warm": 2, "conditions": READY}, "b": {"warm": 0, "conditions": READY}}
    st = pool_status(per, {"a": 2, "b": 0}, 2)
    assert st["node"] == "a" and st["conditions"] == READY


def test_claim_children_carry_node_and_endpoint():
    per = {"a": {"claimed": 1, "children": [{"id": "c1", "status": "running"}], "conditions": READY,
                 "expiresAt": "2026-01-01T00:10:00Z"},
           "b": {"claimed": 1, "children": [{"id": "c2", "status": "running"}], "conditions": READY,
                 "expiresAt": "2026-01-01T00:09:00Z"}}
    st = claim_status(per, {"a": "http://10.0.0.1:8889", "b": "/var/lib/forkd/forkd.sock"}, {})
    assert st["children"] == [{"id": "c1", "status": "running", "node": "a", "endpoint": "http://10.0.0.1:8889"},
                              {"id": "c2", "status": "running", "node": "b"}]  # a unix socket is no endpoint
    assert st["claimed"] == 2 and st["expiresAt"] == "2026-01-01T00:09:00Z" and "node" not in st
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["message"] == "2 children on nodes a, b"  # all of them, not one node's


def test_children_on_a_node_that_left_are_reported_lost():
    previous = {"children": [{"id": "c1", "status": "running", "node": "a", "endpoint": "http://a"},
                             {"id": "c2", "status": "running", "node": "b", "endpoint": "http://b"}]}
    per = {"a": {"claimed": 1, "children": [{"id": "c1", "status": "running"}], "conditions": READY}}
    st = claim_status(per, {"a": "http://a"}, previous)
    assert [(c["id"], c["status"], c["node"]) for c in st["children"]] == [("c1", "running", "a"), ("c2", LOST, "b")]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Degraded"]["reason"] == "NodeLost"
    assert "c2" in conds["Degraded"]["message"] and "b" in conds["Degraded"]["message"]
    # every node gone: still reported, nothing dropped
    st = claim_status({}, {}, previous)
    assert {c["id"] for c in st["children"] if c["status"] == LOST} == {"c1", "c2"}


def test_a_claim_pinned_to_a_node_that_left_is_lost_not_invalid(monkeypatch):
    """A pin naming no known node is a bad spec, unless the claim's status has children there: then the node left."""
    from forkd.base.errors import InvalidInput
    from forkd.operator import handlers
    from tests.test_operator import resource

    monkeypatch.setenv("FORKD_NODES", "a=http://a")
    body = resource("ForkClaim", "pinned", {"pool": "p", "count": 1})
    body["metadata"]["annotations"][handlers.NODE_KEY] = "b"
    with pytest.raises(InvalidInput, match="not a known node"):
        handlers._targets(body, handlers.to_model(body), {"a": "http://a"})
    body["status"] = {"children": [{"id": "c1", "status": "running", "node": "b", "endpoint": "http://b"}]}
    assert handlers._targets(body, handlers.to_model(body), {"a": "http://a"}) == {}
    st = claim_status({}, {"a": "http://a"}, body["status"])
    assert st["children"][0]["status"] == LOST


def test_an_error_keeps_what_the_status_knew():
    """A failed reconcile says why in its conditions and keeps the rest: a claim's children (lost ones too) stay in
    its status, else the next tick would find it placed nowhere and claim again elsewhere."""
    from forkd.base.errors import Unavailable
    from forkd.operator import handlers

    previous = {"children": [{"id": "c1", "status": LOST, "node": "b"}], "tokenSecret": "forkd-claim-x",
                "observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
    out = handlers.error_status(Unavailable("the API server timed out"), 1, previous)
    assert out["children"] == previous["children"] and out["tokenSecret"] == "forkd-claim-x"
    ready = next(c for c in out["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "DaemonError")
