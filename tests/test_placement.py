"""Placement of Kubernetes objects on several node daemons (FORKD_NODES): two real `forkd serve` daemons, each
on a store of its own (two "nodes" on this one machine), on the fake VMM driver (tests/fake_vmm.py: placement,
capacity and the reconcilers are logic above the driver, which passes the same contract tests as QEMU); node "a" is
reached over its unix socket, node "b" over TCP on loopback with a bearer token, as a remote node would be. No
Kubernetes API server can be installed on this machine: the kopf handlers are called directly with realistic resource
bodies, as in test_operator.py."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kopf
import pytest

from forkd.base.errors import NotFound
from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from forkd.operator import handlers
from tests.test_operator import call, condition, reconcile_until, resource

# memory each node daemon offers (FORKD_NODE_MEMORY_MIB): equal, so hashing breaks the tie at first. Small beside the
# host's MemAvailable, which both nodes share (a node reports the lesser of the two): with a larger offer a host short
# of memory (other tests' tmpfs) capped both nodes alike and hashing, not room, placed the pool.
NODE_MIB = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(rt, name: str, tcp: bool = False):
    home = Path(tempfile.mkdtemp(prefix=f"fkn{name}", dir="/tmp"))
    layout = Layout(home).ensure()
    shutil.rmtree(layout.images)
    shutil.copytree(rt.layout.images, layout.images, symlinks=True)
    if rt.layout.accel_cache.exists():
        shutil.copy(rt.layout.accel_cache, layout.accel_cache)
    log = open(home / "daemon.log", "ab")
    argv = [sys.executable, "-m", "forkd.api", "serve", "--interval", "1"]
    endpoint = str(layout.daemon_socket)
    if tcp:
        port = _free_port()
        argv += ["--bind", f"127.0.0.1:{port}", "--token-file", str(home / "token")]
        endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ, FORKD_HOME=str(home), FORKD_NODE_MEMORY_MIB=str(NODE_MIB))  # as much offered by each
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 120  # a bound on a hang, not a speed check: a loaded host starts Python slowly
    try:
        while not layout.daemon_socket.exists() or (tcp and not _listening(port)):
            assert proc.poll() is None and time.monotonic() < deadline, (home / "daemon.log").read_text()[-2000:]
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)
        raise
    return home, proc, endpoint


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def two_nodes(fake_rt):
    fake_rt.build_image()  # the fake driver's stub image, copied into each node's store
    made: dict = {}
    old = {k: os.environ.get(k) for k in ("FORKD_NODES", "FORKD_TOKEN")}
    try:  # a node that fails to start still takes the one started before it down
        made["a"] = _node(fake_rt, "a")
        made["b"] = _node(fake_rt, "b", tcp=True)
        os.environ["FORKD_NODES"] = ",".join(f"{n}={endpoint}" for n, (_, _, endpoint) in made.items())
        os.environ["FORKD_TOKEN"] = (made["b"][0] / "token").read_text().strip()
        yield {n: Runtime(Layout(home)) for n, (home, _, _) in made.items()}
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for home, proc, _ in made.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            r = Runtime(Layout(home))
            r.kill(all_=True)
            shutil.rmtree(Layout(home).flat_cache.parent, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)


def test_pools_go_to_one_node_each_parents_to_all(two_nodes):
    parent = resource("ForkParent", "pl-base", {"memoryMiB": 256})
    pools = [resource("ForkPool", f"pl-pool{i}", {"from": "pl-base", "warm": 1}) for i in range(3)]
    pinned = resource("ForkPool", "pl-pinned", {"from": "pl-base", "warm": 1})
    pinned["metadata"]["annotations"][handlers.NODE_KEY] = "b"
    bodies = [parent, *pools, pinned]
    assert handlers.place(parent) == ["a", "b"] and handlers.place(pinned) == ["b"]
    first = handlers.place(pools[0])
    key = f"{pools[0]['metadata']['namespace']}/pl-pool0"
    assert first == [handlers._rendezvous(["a", "b"], key)]  # equal capacity: hashing decides
    assert handlers.place(pools[0]) == first  # stable
    try:
        reconcile_until(bodies, lambda: all(condition(b, "Ready").get("status") == "True" for b in bodies),
                        timeout=300, what="everything Ready on its node")
        endpoints = handlers.nodes()
        assert endpoints["b"].startswith("http://127.0.0.1:")
        for node, rt_ in two_nodes.items():  # the parent is on every node
            assert rt_.snapshot_info(handlers.daemon(endpoints[node]).get(
                "ForkParent", "pl-base")[0].status.snapshot)["status"] == "ready"
        for body in [*pools, pinned]:
            name = body["metadata"]["name"]
            node = body["status"]["node"]
            assert node in ("a", "b") and handlers.place(body) == [node]  # a placed pool stays
            assert name != "pl-pinned" or node == "b"
            here, there = two_nodes[node], two_nodes["b" if node == "a" else "a"]
            kids = [r for r in here.children() if r.pool == name and r.status == "running"]
            assert len(kids) == 1 and here.ping(kids[0].id)["child_id"] == kids[0].id
            assert not [r for r in there.children() if r.pool == name]
            with pytest.raises(NotFound):
                handlers.daemon(endpoints["b" if node == "a" else "a"]).get("ForkPool", name)
    finally:
        for body in [*pools, pinned, parent]:
            call(handlers.release, body, wait=120)
    for endpoint in handlers.nodes().values():
        for body in bodies:
            with pytest.raises(NotFound):
                handlers.daemon(endpoint).get(body["kind"], body["metadata"]["name"])


def test_branch_of_a_child_id_needs_a_pin_with_several_nodes(two_nodes):
    from forkd.base.errors import InvalidInput

    body = {"kind": "ForkBranch", "metadata": {"name": "b1", "namespace": "default"},
            "spec": {"sandbox": "c0123456789"}}
    with pytest.raises(InvalidInput, match="needs the annotation"):
        handlers.place(body)
    body["spec"]["sandbox"] = "pool/pl-pool0"
    assert handlers.place(body) == handlers.place(resource("ForkPool", "pl-pool0", {"from": "x"}))


def test_pools_go_where_they_fit(two_nodes):
    """Each node reports its capacity; a pool goes to the node with room even when hashing prefers the other, and
    a pool larger than all the nodes together is Degraded with reason NoCapacity (and is applied to no node)."""
    endpoints = handlers.nodes()
    caps = {n: handlers.daemon(ep).capacity() for n, ep in endpoints.items()}
    for cap in caps.values():
        assert cap["memoryAllocatableMiB"] == NODE_MIB and cap["childrenRunning"] == 0
        assert 0 < cap["memoryAvailableMiB"] <= NODE_MIB and cap["memoryTotalMiB"] > 0
    parent = resource("ForkParent", "pf-base", {"memoryMiB": 256})
    probe = resource("ForkPool", "pf-fit", {"from": "pf-base", "warm": 1})
    preferred = handlers._rendezvous(["a", "b"], f"{probe['metadata']['namespace']}/pf-fit")
    other = "b" if preferred == "a" else "a"
    assert handlers.place(probe) == [preferred]
    big = resource("ForkPool", "pf-big", {"from": "pf-base", "warm": 3})  # 3 x 128 MiB counted on `preferred`
    big["metadata"]["annotations"][handlers.NODE_KEY] = preferred
    huge = resource("ForkPool", "pf-huge", {"from": "pf-base", "warm": 200})  # 25600 MiB: more than both nodes
    try:
        reconcile_until([parent, big], lambda: condition(big, "Ready").get("status") == "True", timeout=300,
                        what="pf-big Ready")
        cap = handlers.daemon(endpoints[preferred]).capacity()
        assert cap["childrenRunning"] >= 3 and cap["pools"].get("pf-big") >= 3
        assert cap["memoryAvailableMiB"] <= NODE_MIB - 3 * 128
        assert handlers.place(probe) == [other]  # it fits better there: capacity first, hashing only breaks ties
        reconcile_until([probe], lambda: condition(probe, "Ready").get("status") == "True", timeout=300,
                        what="pf-fit Ready")
        assert probe["status"]["node"] == other
        with pytest.raises(handlers.NoCapacity, match="needs 200 warm children of 128 MiB"):
            handlers.place(huge)
        with pytest.raises(kopf.TemporaryError):
            call(handlers.reconcile, huge)
        degraded = condition(huge, "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "NoCapacity"
        assert "the nodes have room for fewer" in degraded["message"]
        for ep in endpoints.values():
            with pytest.raises(NotFound):
                handlers.daemon(ep).get("ForkPool", "pf-huge")
    finally:
        for body in [probe, big, huge, parent]:
            call(handlers.release, body, wait=120)
