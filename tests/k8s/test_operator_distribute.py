"""Build once, distribute by content, through the operator: the real operator process against the API server
stand-in (kmock's KubernetesEmulator, tests/k8s/apiserver.py: not a real API server), two real node daemons and a
real OCI registry on loopback (Debian's docker-registry, tests.registries). With FORKD_OPERATOR_REGISTRY set, a
ForkParent is built on one node only, pushed from there, and pulled by digest by the other before the object is
applied there; status.distribution records the artifact and each node's digest. The daemons run the fake VMM driver
(forkd/vmm/fake.py: the real guest agent as a host process; it passes tests/test_driver_contract.py), so what is
checked is the distribution, not a boot: tests/test_snapshot_registry.py forks a real VM from a pulled snapshot.
"""

from __future__ import annotations

import pytest

from forkd.base.errors import NotFound
from forkd.client.backends import RemoteBackend
from forkd.spec.namespaces import qname
from tests.k8s.apiserver import GROUP, VERSION
from tests.k8s.conftest import Node, Operator, wait_for

NS = "team-d"

pytestmark = pytest.mark.image  # the builder node builds the default guest image


@pytest.fixture
def two(monkeypatch):
    monkeypatch.setenv("FORKD_VMM_DRIVER", "fake")  # the daemons inherit it
    made = [Node(f"x{i}") for i in (1, 2)]
    yield made
    for n in made:
        n.stop()


def _snapshot(node: Node, tag: str) -> dict | None:
    try:
        return RemoteBackend(node.socket).snapshot_info(tag)
    except NotFound:
        return None


def test_a_parent_and_a_layer_are_built_once_and_pulled_by_digest_elsewhere(api, two, workdir, registry_http):
    op = Operator(api, two, workdir, FORKD_OPERATOR_REGISTRY=f"{registry_http.host}/forkd-op",
                  FORKD_INSECURE_REGISTRIES=registry_http.host).start()
    try:
        api.create("forkparents", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkParent",
                                   "metadata": {"name": "shared", "namespace": NS},
                                   "spec": {"memoryMiB": 256, "warmup": {"imports": ["json"]}}})
        st = wait_for("the parent Ready on both nodes", lambda: (o := api.get("forkparents", NS, "shared"))
                      and len(((o.get("status") or {}).get("distribution") or {}).get("nodes") or []) == 2
                      and o["status"], timeout=600, log=op.log)
        dist = st["distribution"]
        via = {c["node"]: c["via"] for c in dist["nodes"]}
        assert sorted(via.values()) == ["built", "pulled"] and via[dist["builtOn"]] == "built", dist
        assert {c["digest"] for c in dist["nodes"]} == {dist["digest"]} and dist["ref"].endswith(dist["digest"])
        by_name = {n.name: n for n in two}
        built, pulled = by_name[dist["builtOn"]], next(n for n in two if n.name != dist["builtOn"])
        a, b = _snapshot(built, dist["snapshot"]), _snapshot(pulled, dist["snapshot"])
        assert a and b and a["memory_sha256"] == b["memory_sha256"] and b["status"] == "ready"
        assert b["labels"]["forkd.dev/source"] == "oci:" + dist["ref"].removeprefix("docker://")
        assert "forkd.dev/source" not in a["labels"]  # built there, not pulled
        assert b["labels"]["forkd.dev/parent"] == a["labels"]["forkd.dev/parent"]  # owned: released with it
        # the pulled node's reconciler found the snapshot ready: it has the object and built nothing
        events = RemoteBackend(pulled.socket).describe("ForkParent", qname(NS, "shared")).get("events") or []
        assert not [e for e in events if e.get("reason") == "BuildParent"], events

        # a layer on it: built where the operator places it, its chain pulled elsewhere (the base already there)
        api.create("forklayers", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkLayer",
                                  "metadata": {"name": "tools", "namespace": NS},
                                  "spec": {"from": "shared", "run": ["echo layered > /root/l"]}})
        lst = wait_for("the layer Ready on both nodes", lambda: (o := api.get("forklayers", NS, "tools"))
                       and len(((o.get("status") or {}).get("distribution") or {}).get("nodes") or []) == 2
                       and o["status"], timeout=600, log=op.log)
        ldist = lst["distribution"]
        lpulled = next(n for n in two if n.name != ldist["builtOn"])
        copy = _snapshot(lpulled, ldist["snapshot"])
        assert copy and copy["parent_tag"] == dist["snapshot"], copy
        assert copy["labels"]["forkd.dev/source"] == "oci:" + ldist["ref"].removeprefix("docker://")

        api.delete("forklayers", NS, "tools")
        api.delete("forkparents", NS, "shared")
        wait_for("every copy released", lambda: all(_snapshot(n, t) is None for n in two
                                                    for t in (dist["snapshot"], ldist["snapshot"])),
                 timeout=180, log=op.log)
    finally:
        op.stop()
