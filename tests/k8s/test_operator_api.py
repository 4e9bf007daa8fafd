"""The operator process against an API server: kopf's watches, status patches, finalizers, /scale, events and a
restart, driven through the API as a user's tools would (kubectl for create, scale and delete; plain HTTP reads).

The API server is a stand-in, not a real one: kmock's KubernetesEmulator (tests/k8s/apiserver.py says what the harness
adds to it). The operator is the real process (`python -m forkd.operator run`) and the node daemons are real
`forkd serve` processes, each on a store of its own (two nodes on this machine). These tests boot no VM: the pools
fork from a parent that is never built (the daemon reports it missing), so everything above the VMs is exercised
in seconds; test_operator_vm.py runs the path to a warm pool and a claim with real VMs.
"""

from __future__ import annotations

import json

import pytest

from forkd.base.errors import NotFound
from forkd.client.backends import RemoteBackend
from forkd.spec.namespaces import qname
from tests.k8s.apiserver import GROUP, VERSION
from tests.k8s.conftest import Node, Operator, wait_for

NS = "team-a"


@pytest.fixture(scope="module")
def nodes():
    made = [Node("n1"), Node("n2")]
    yield made
    for n in made:
        n.stop()


@pytest.fixture
def operator(api, nodes, workdir):
    op = Operator(api, nodes, workdir).start()
    yield op
    op.stop()


def pool_doc(name: str, warm: int, parent: str = "never-built") -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkPool",
            "metadata": {"name": name, "namespace": NS, "labels": {"team": "a"}},
            "spec": {"from": parent, "warm": warm, "maxChildren": 8, "child": {"memoryLimitMiB": 128}}}


def cond(obj: dict | None, type_: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def daemon_obj(node: Node, kind: str, name: str):
    try:
        return RemoteBackend(node.socket).get(kind, qname(NS, name))[0]
    except NotFound:
        return None


def holder(nodes: list[Node], kind: str, name: str) -> Node | None:
    return next((n for n in nodes if daemon_obj(n, kind, name) is not None), None)


def test_pool_lifecycle_through_the_api(api, nodes, operator):
    """Create -> finalizer added, placed on a node (status.node), status patched with conditions saying why it is
    not Ready; /scale -> spec.warm on the node daemon, observedGeneration follows; events posted; delete -> the
    finalizer's handler removes the daemon's object, then the resource is gone."""
    # --validate=false: the emulator serves no OpenAPI document for kubectl's client-side validation
    api.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(pool_doc("api-pool", 2)))
    got = wait_for("status.node and a Degraded condition", lambda: (o := api.get("forkpools", NS, "api-pool"))
                   and (o.get("status") or {}).get("node") and cond(o, "Degraded").get("status") == "True" and o,
                   log=operator.log)
    assert "forkd.dev/finalizer" in got["metadata"]["finalizers"]
    assert cond(got, "Ready")["status"] in ("False", "Unknown")
    node = next(n for n in nodes if n.name == got["status"]["node"])
    on_node = daemon_obj(node, "ForkPool", "api-pool")
    assert on_node is not None and on_node.spec.warm == 2
    assert on_node.metadata.annotations["forkd.dev/managed-by"] == "operator"
    assert all(daemon_obj(n, "ForkPool", "api-pool") is None for n in nodes if n is not node)

    # kubectl scale: through the /scale subresource (specReplicasPath .spec.warm)
    api.kubectl("scale", "-n", NS, "forkpools/api-pool", "--replicas", "3")
    got = api.get("forkpools", NS, "api-pool")
    assert got["spec"]["warm"] == 3 and got["metadata"]["generation"] == 2
    scale = api.request("GET", api.path("forkpools", NS, "api-pool", "scale")).json()
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    wait_for("spec.warm 3 on the node daemon", lambda: daemon_obj(node, "ForkPool", "api-pool").spec.warm == 3,
             log=operator.log)
    wait_for("observedGeneration 2", lambda: (api.get("forkpools", NS, "api-pool").get("status") or {})
             .get("observedGeneration") == 2, log=operator.log)

    # the daemon's events of the pool, posted as Kubernetes Events on it
    evs = wait_for("events on ForkPool/api-pool", lambda: [
        e for e in api.events(NS) if e.get("involvedObject", {}).get("name") == "api-pool"], log=operator.log)
    assert {e["involvedObject"]["kind"] for e in evs} == {"ForkPool"}
    assert any(e["reason"] == "Applied" for e in evs), [e["reason"] for e in evs]

    api.kubectl("delete", "-n", NS, "forkpools/api-pool", "--wait=false")
    wait_for("the resource gone (finalizer released)", lambda: api.get("forkpools", NS, "api-pool") is None,
             timeout=300, log=operator.log)  # kopf may hold a finished deletion for its delayed handlers (60 s)
    assert daemon_obj(node, "ForkPool", "api-pool") is None


def test_operator_restart_converges(api, nodes, workdir):
    """Killed mid-way (SIGKILL), the operator misses a spec change and a delete; the next process resumes every
    resource, applies the change, and runs the pending delete's finalizer."""
    op = Operator(api, nodes, workdir).start()
    try:
        api.create("forkpools", pool_doc("keep", 1))
        api.create("forkpools", pool_doc("gone", 1))
        for name in ("keep", "gone"):
            wait_for(f"{name} placed", lambda name=name: holder(nodes, "ForkPool", name), log=op.log)
        op.kill()
        api.patch("forkpools", NS, "keep", {"spec": {"warm": 4}})
        api.delete("forkpools", NS, "gone")  # the finalizer holds it: deletionTimestamp set, nobody to act
        assert api.get("forkpools", NS, "gone")["metadata"].get("deletionTimestamp")
        keeper = holder(nodes, "ForkPool", "keep")
        assert daemon_obj(keeper, "ForkPool", "keep").spec.warm == 1
        op.start()
        wait_for("the change applied after the restart", lambda: daemon_obj(keeper, "ForkPool", "keep").spec.warm
                 == 4, log=op.log)
        wait_for("the pending delete finished", lambda: api.get("forkpools", NS, "gone") is None
                 and holder(nodes, "ForkPool", "gone") is None, log=op.log)
        api.delete("forkpools", NS, "keep")
        wait_for("keep deleted", lambda: api.get("forkpools", NS, "keep") is None, log=op.log)
    finally:
        op.stop()


def test_invalid_spec_is_reported_not_retried(api, nodes, operator):
    """A spec the daemon's model refuses: Degraded, reason InvalidSpec, naming the field; nothing on any node."""
    doc = pool_doc("bad-pool", 1)
    doc["spec"]["warm"] = -1
    api.create("forkpools", doc)
    got = wait_for("InvalidSpec", lambda: (o := api.get("forkpools", NS, "bad-pool"))
                   and cond(o, "Degraded").get("reason") == "InvalidSpec" and o, log=operator.log)
    assert "warm" in cond(got, "Degraded")["message"]
    assert cond(got, "Reconciling")["status"] == "False"
    assert holder(nodes, "ForkPool", "bad-pool") is None
    api.delete("forkpools", NS, "bad-pool")
    wait_for("bad-pool deleted", lambda: api.get("forkpools", NS, "bad-pool") is None, log=operator.log)
