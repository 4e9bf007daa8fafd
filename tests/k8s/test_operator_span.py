"""A pool across two nodes, and a claim a pod can reach: the real operator process against the API server stand-in
(kmock's KubernetesEmulator, tests/k8s/apiserver.py: not a real API server), two real node daemons over TCP on
loopback (one bearer token, found from their pods). Each node offers room for one child, so `warm: 2` is split one
per node, and a claim of two takes one warm child from each. The pod is simulated by a subprocess that has nothing
but the claim Secret's token and endpoints (no FORKD_TOKEN, no FORKD_HOME): it execs in its children through the
Python SDK and is refused for another child.

Run twice: with the fake VMM driver (forkd/vmm/fake.py: each child is the real guest agent as host processes; it
passes tests/test_driver_contract.py), in the default tier, since what is checked (placement over two daemons, the
claim's status and Secret, the scoped token at each daemon's API) is above the driver; and with real VMs in the VM
tier's long run (two parents built under TCG take minutes).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest

from forkd.client.backends import RemoteBackend
from tests.k8s.apiserver import GROUP, VERSION
from tests.k8s.conftest import Node, Operator, wait_for

NS = "agents"
SYSTEM = "forkd-system"
TOKEN = secrets.token_urlsafe(32)
SELECTOR = f"{SYSTEM}/app.kubernetes.io/component=node-daemon"

POD = r"""
import json, os, sys
from forkd_client import Sandbox
from forkd_client.errors import ForkdError

token, children, other = os.environ["CLAIM_TOKEN"], json.loads(os.environ["CLAIM_CHILDREN"]), json.loads(sys.argv[1])
out = {"ran": {}, "refused": None}
for c in children:
    sb = Sandbox.connect(c["id"], url=c["endpoint"], token=token)
    out["ran"][c["id"]] = sb.commands.run("echo from-$(hostname)").stdout.strip()
try:
    Sandbox.connect(other["id"], url=other["endpoint"], token=token).commands.run("true")
except ForkdError as exc:
    out["refused"] = exc.status
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=["fake", pytest.param("qemu", marks=[pytest.mark.vm, pytest.mark.long])])
def two(request, tmp_path_factory):
    rt = None
    if request.param == "qemu":
        rt = request.getfixturevalue("rt")
        rt.build_image()  # the session's (cached); each node's store gets a copy
    made = []
    logs = tmp_path_factory.mktemp("span-nodes")
    for name in ("s1", "s2"):
        # room for one child of 128 MiB; the logs kept for a failure
        node = Node(name, images=rt.layout.images if rt else None, token=TOKEN, memory_mib=200, logdir=logs,
                    driver=request.param)
        if rt is not None and rt.layout.accel_cache.exists():
            shutil.copy(rt.layout.accel_cache, node.layout.accel_cache)
        made.append(node)
    yield made
    for n in made:
        n.stop()


def doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def ready(obj: dict | None) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in ((obj or {}).get("status") or {})
               .get("conditions") or [])


def pod_run(secret: dict, other: dict) -> dict:
    """The pod: a process with only the Secret's data (as a pod gets it mounted or in its environment)."""
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    env.update(CLAIM_TOKEN=data["token"], CLAIM_CHILDREN=data["children"])
    res = subprocess.run([sys.executable, "-c", POD, json.dumps(other)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.mark.timeout(3000)  # two parents built at once under TCG on a shared machine (minutes, not ten)
def test_pool_across_nodes_claim_reached_from_a_pod(api, two, workdir):
    for n in two:
        api.create("pods", n.pod(SYSTEM))
    op = Operator(api, None, workdir, FORKD_NODE_PODS=SELECTOR, FORKD_TOKEN=TOKEN).start()
    try:
        api.create("forkparents", doc("ForkParent", "sp-base", {"memoryMiB": 256}))
        api.create("forkpools", doc("ForkPool", "sp-pool", {"from": "sp-base", "warm": 2, "maxChildren": 4}))
        pool = wait_for("pool Ready, 2 warm split 1+1", lambda: (o := api.get("forkpools", NS, "sp-pool"))
                        and ready(o) and o["status"].get("warm") == 2 and o, timeout=2400, log=op.log)
        assert {(s["node"], s["target"], s["warm"]) for s in pool["status"]["nodes"]} == {("s1", 1, 1), ("s2", 1, 1)}

        api.create("forkclaims", doc("ForkClaim", "sp-claim", {"pool": "sp-pool", "count": 2, "ttl": "10m"}))
        claim = wait_for("claim Ready with its Secret", lambda: (o := api.get("forkclaims", NS, "sp-claim"))
                         and ready(o) and o["status"].get("tokenSecret") and len(o["status"]["children"]) == 2
                         and o, timeout=600, log=op.log)
        kids = claim["status"]["children"]
        assert {c["node"] for c in kids} == {"s1", "s2"}  # one warm child from each node
        by_node = {n.name: n for n in two}
        assert all(c["endpoint"] == by_node[c["node"]].url and c["status"] == "running" for c in kids), kids
        secret = api.get("secrets", NS, claim["status"]["tokenSecret"])
        assert secret["metadata"]["ownerReferences"][0]["uid"] == claim["metadata"]["uid"]

        s1 = RemoteBackend(url=by_node["s1"].url, token=TOKEN)  # the pool refills: a warm child outside the claim
        other = wait_for("a warm child on s1 outside the claim", lambda: next(
            (c for c in s1.children() if c.get("status") == "running" and c["id"] not in {k["id"] for k in kids}
             and not c.get("claimed")), None), timeout=600, log=op.log)
        got = pod_run(secret, {"id": other["id"], "endpoint": by_node["s1"].url})
        assert set(got["ran"]) == {c["id"] for c in kids} and all(v.startswith("from-") for v in got["ran"].values())
        assert got["refused"] == 403, got

        api.delete("forkclaims", NS, "sp-claim")
        wait_for("claim and Secret gone", lambda: api.get("forkclaims", NS, "sp-claim") is None
                 and api.get("secrets", NS, claim["status"]["tokenSecret"]) is None, timeout=300, log=op.log)
        api.delete("forkpools", NS, "sp-pool")
        api.delete("forkparents", NS, "sp-base")
        wait_for("pool and parent gone", lambda: api.get("forkpools", NS, "sp-pool") is None
                 and api.get("forkparents", NS, "sp-base") is None, timeout=300, log=op.log)
    finally:
        op.stop()
        for n in two:
            api.request("DELETE", api.path("pods", SYSTEM, n.pod()["metadata"]["name"]))
