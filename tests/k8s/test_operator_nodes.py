"""Nodes found from the cluster, and a pool split across them: the real operator process against the API server
stand-in (kmock's KubernetesEmulator, tests/k8s/apiserver.py: not a real API server) with three real node daemons
over TCP on loopback (one bearer token, as the DaemonSet's daemons share one). The nodes are not listed: the test
writes each daemon's pod (Ready, with its `api` port) as the DaemonSet controller and the kubelet would, and the
operator finds them (FORKD_NODE_PODS). No VM boots: the pool forks from a parent that is never built, so what is
checked is where its shares go (each daemon's ForkPool spec.warm), which needs no child.
"""

from __future__ import annotations

import secrets

import pytest

from forkd.base.errors import NotFound
from forkd.client.backends import RemoteBackend
from forkd.spec.namespaces import qname
from tests.k8s.apiserver import GROUP, VERSION
from tests.k8s.conftest import Node, Operator, wait_for

NS = "team-n"
SYSTEM = "forkd-system"
TOKEN = secrets.token_urlsafe(32)
SELECTOR = f"{SYSTEM}/app.kubernetes.io/name=forkd,app.kubernetes.io/component=node-daemon"


@pytest.fixture(scope="module")
def three():
    made = [Node(f"d{i}", token=TOKEN, memory_mib=300) for i in (1, 2, 3)]  # room for 2 children of 128 MiB each
    yield made
    for n in made:
        n.stop()


def share(node: Node, name: str) -> int | None:
    """The warm share the node's daemon holds for pool `name` (None: it holds no such pool)."""
    try:
        return RemoteBackend(url=node.url, token=TOKEN).get("ForkPool", qname(NS, name))[0].spec.warm
    except NotFound:
        return None


def test_discovered_nodes_split_and_a_lost_node_refilled(api, three, workdir):
    """The operator finds the daemons from their pods; `warm: 4` (more than one node's room of 2) is split across
    them and status.nodes says how; a node whose pod goes away keeps nothing in the split: its share is refilled on
    the others; when it comes back, still holding its old share, the shares are trimmed back to 4 in all."""
    for n in three:
        api.create("pods", n.pod(SYSTEM))
    op = Operator(api, None, workdir, FORKD_NODE_PODS=SELECTOR, FORKD_TOKEN=TOKEN).start()
    try:
        api.create("forkpools", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkPool",
                                 "metadata": {"name": "wide", "namespace": NS},
                                 "spec": {"from": "never-built", "warm": 4, "child": {"memoryLimitMiB": 128}}})
        st = wait_for("the split in status.nodes", lambda: (o := api.get("forkpools", NS, "wide"))
                      and sum(s["target"] for s in (o.get("status") or {}).get("nodes") or []) == 4 and o["status"],
                      log=op.log)
        split = {s["node"]: s["target"] for s in st["nodes"]}
        assert all(v <= 2 for v in split.values()) and len([v for v in split.values() if v]) >= 2, split
        assert st["target"] == 4 and "node" not in st  # on several nodes: no single status.node
        for n in three:  # each daemon holds exactly its share
            assert share(n, "wide") == (split.get(n.name) or None), (n.name, split)

        gone = next(n for n in three if split.get(n.name))
        api.delete("pods", SYSTEM, gone.pod()["metadata"]["name"])
        st = wait_for(f"{gone.name}'s share refilled elsewhere", lambda: (o := api.get("forkpools", NS, "wide"))
                      and gone.name not in {s["node"] for s in (o.get("status") or {}).get("nodes") or []}
                      and sum(s["target"] for s in o["status"]["nodes"]) == 4 and o["status"], timeout=300, log=op.log)
        after = {s["node"]: s["target"] for s in st["nodes"]}
        assert all(v <= 2 for v in after.values()) and sum(after.values()) == 4, after
        for n in three:
            if n is not gone:
                assert share(n, "wide") == (after.get(n.name) or None), (n.name, after)
        assert f"node {gone.name} left" in op.log.read_text()

        api.create("pods", gone.pod(SYSTEM))  # the node comes back, still holding its old share: no double count

        def back():
            st = (api.get("forkpools", NS, "wide") or {}).get("status") or {}
            now = {s["node"]: s["target"] for s in st.get("nodes") or []}
            return gone.name in now and sum(now.values()) == 4 and all(
                share(n, "wide") == now.get(n.name) for n in three) and now
        now = wait_for(f"{gone.name} back in the split, 4 warm in all", back, timeout=300, log=op.log)
        assert all(v <= 2 for v in now.values()), now

        api.delete("forkpools", NS, "wide")
        wait_for("the pool deleted on every node", lambda: api.get("forkpools", NS, "wide") is None
                 and all(share(n, "wide") is None for n in three), timeout=300, log=op.log)
    finally:
        op.stop()
        for n in three:
            api.request("DELETE", api.path("pods", SYSTEM, n.pod()["metadata"]["name"]))


def test_no_node_pod_no_placement(api, workdir):
    """With discovery on and no Ready daemon pod, a pool is Degraded (NoCapacity: no node daemon is known)."""
    op = Operator(api, None, workdir, FORKD_NODE_PODS=SELECTOR, FORKD_TOKEN=TOKEN).start()
    try:
        api.create("forkpools", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkPool",
                                 "metadata": {"name": "nowhere", "namespace": NS},
                                 "spec": {"from": "never-built", "warm": 1}})
        got = wait_for("Degraded", lambda: (o := api.get("forkpools", NS, "nowhere")) and next(
            (c for c in (o.get("status") or {}).get("conditions") or [] if c["type"] == "Degraded"
             and c["status"] == "True"), None), timeout=300, log=op.log)
        assert got["reason"] == "NoCapacity", got
        api.delete("forkpools", NS, "nowhere")
        wait_for("deleted", lambda: api.get("forkpools", NS, "nowhere") is None, timeout=300, log=op.log)
    finally:
        op.stop()


def test_children_on_a_node_that_left_are_reported_lost(api, three, workdir):
    """A claim whose status (written by the operator before) places a child on a node that is gone: after a
    restart the operator keeps that child in status.children as `lost`, says so (Degraded, NodeLost), and claims
    nothing in its place on the nodes that are left."""
    for n in three:
        api.create("pods", n.pod(SYSTEM))
    api.create("forkclaims", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkClaim",
                              "metadata": {"name": "stranded", "namespace": NS}, "spec": {"pool": "wide", "count": 1}})
    was = {"id": "c-0123abcd", "status": "running", "node": "vanished", "endpoint": "http://10.9.9.9:8889"}
    api.patch("forkclaims", NS, "stranded", {"status": {"children": [was], "claimed": 1}}, sub="status")
    op = Operator(api, None, workdir, FORKD_NODE_PODS=SELECTOR, FORKD_TOKEN=TOKEN).start()
    try:
        got = wait_for("NodeLost", lambda: (o := api.get("forkclaims", NS, "stranded")) and next(
            (c for c in (o.get("status") or {}).get("conditions") or [] if c["type"] == "Degraded"
             and c["reason"] == "NodeLost"), None) and o, timeout=300, log=op.log)
        assert got["status"]["children"] == [{**was, "status": "lost"}]
        assert "c-0123abcd" in next(c for c in got["status"]["conditions"] if c["type"] == "Ready")["message"]
        assert "tokenSecret" not in got["status"]
        for n in three:
            with pytest.raises(NotFound):
                RemoteBackend(url=n.url, token=TOKEN).get("ForkClaim", qname(NS, "stranded"))
        api.delete("forkclaims", NS, "stranded")
        wait_for("deleted", lambda: api.get("forkclaims", NS, "stranded") is None, timeout=300, log=op.log)
    finally:
        op.stop()
        for n in three:
            api.request("DELETE", api.path("pods", SYSTEM, n.pod()["metadata"]["name"]))
