"""From an empty namespace to a claimed, answering child through the API server: the real operator process, a real
node daemon, real VMs. The API server is a stand-in (kmock's KubernetesEmulator, tests/k8s/apiserver.py)."""

from __future__ import annotations

import shutil

import pytest

from forkd.client.backends import RemoteBackend
from tests.k8s.apiserver import GROUP, VERSION
from tests.k8s.conftest import Node, Operator, wait_for

pytestmark = pytest.mark.vm
NS = "sandboxes"


@pytest.fixture(scope="module")
def vm_node(rt):
    rt.build_image()  # the session's image (cached): the node's store gets a copy, as the init container builds one
    node = Node("vm", images=rt.layout.images)
    if rt.layout.accel_cache.exists():
        shutil.copy(rt.layout.accel_cache, node.layout.accel_cache)
    yield node
    node.stop()


def doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def ready(obj: dict | None) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in ((obj or {}).get("status") or {})
               .get("conditions") or [])


def test_parent_pool_claim_delete(api, vm_node, workdir):
    """ForkParent + ForkPool -> Ready with the warm count in status; ForkClaim -> its status names a running child
    that answers; deleting the claim kills that child; deleting pool and parent leaves nothing on the node."""
    op = Operator(api, [vm_node], workdir).start()
    b = RemoteBackend(vm_node.socket)
    try:
        api.create("forkparents", doc("ForkParent", "k-base", {"memoryMiB": 256}))
        api.create("forkpools", doc("ForkPool", "k-pool", {"from": "k-base", "warm": 1, "maxChildren": 4}))
        pool = wait_for("pool Ready with 1 warm", lambda: (o := api.get("forkpools", NS, "k-pool")) and ready(o)
                        and o["status"].get("warm") == 1 and o, timeout=900, log=op.log)
        assert pool["status"]["node"] == "vm" and pool["status"]["observedGeneration"] == 1
        assert ready(api.get("forkparents", NS, "k-base"))

        api.create("forkclaims", doc("ForkClaim", "k-claim", {"pool": "k-pool", "count": 1, "ttl": "10m"}))
        claim = wait_for("claim Ready", lambda: (o := api.get("forkclaims", NS, "k-claim")) and ready(o) and o,
                         timeout=300, log=op.log)
        [child] = claim["status"]["children"]
        assert child["status"] == "running" and claim["status"]["node"] == "vm"
        assert "claimed" in b.exec(child["id"], ["echo", "claimed"])["stdout"]

        api.delete("forkclaims", NS, "k-claim")
        wait_for("claim gone", lambda: api.get("forkclaims", NS, "k-claim") is None, log=op.log)
        assert child["id"] not in {c["id"] for c in b.children() if c.get("status") == "running"}

        api.delete("forkpools", NS, "k-pool")
        api.delete("forkparents", NS, "k-base")
        wait_for("pool and parent gone", lambda: api.get("forkpools", NS, "k-pool") is None
                 and api.get("forkparents", NS, "k-base") is None, timeout=300, log=op.log)
        assert not [c for c in b.children() if c.get("status") == "running"]
    finally:
        op.stop()
