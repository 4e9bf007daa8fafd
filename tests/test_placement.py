"""Placement of Kubernetes objects on several node daemons (FORKD_NODES): two real `forkd serve` daemons, each
on a store of its own (two "nodes" on this one machine), with real VMs. No Kubernetes API server can be installed
on this machine: the kopf handlers are called directly with realistic resource bodies, as in test_operator.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from forkd.base.errors import NotFound
from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from forkd.operator import handlers
from tests.test_operator import call, condition, reconcile_until, resource

pytestmark = pytest.mark.vm


def _node(rt, name: str):
    home = Path(tempfile.mkdtemp(prefix=f"fkn{name}", dir="/tmp"))
    layout = Layout(home).ensure()
    shutil.rmtree(layout.images)
    shutil.copytree(rt.layout.images, layout.images, symlinks=True)
    if rt.layout.accel_cache.exists():
        shutil.copy(rt.layout.accel_cache, layout.accel_cache)
    log = open(home / "daemon.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "1"],
                            env=dict(os.environ, FORKD_HOME=str(home)), stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not layout.daemon_socket.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (home / "daemon.log").read_text()[-2000:]
        time.sleep(0.05)
    return home, proc


@pytest.fixture(scope="module")
def two_nodes(rt):
    made = {n: _node(rt, n) for n in ("a", "b")}
    old = os.environ.get("FORKD_NODES")
    os.environ["FORKD_NODES"] = ",".join(f"{n}={home / 'forkd.sock'}" for n, (home, _) in made.items())
    yield {n: Runtime(Layout(home)) for n, (home, _) in made.items()}
    if old is None:
        os.environ.pop("FORKD_NODES", None)
    else:
        os.environ["FORKD_NODES"] = old
    for home, proc in made.values():
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
    expected = {b["metadata"]["name"]: handlers.place(b) for b in bodies}
    assert expected["pl-base"] == ["a", "b"] and expected["pl-pinned"] == ["b"]
    assert all(len(expected[p["metadata"]["name"]]) == 1 for p in pools)
    assert handlers.place(pools[0]) == expected["pl-pool0"]  # stable
    try:
        reconcile_until(bodies, lambda: all(condition(b, "Ready").get("status") == "True" for b in bodies),
                        timeout=300, what="everything Ready on its node")
        for rt_ in two_nodes.values():  # the parent is on every node
            assert rt_.snapshot_info(handlers.daemon(str(rt_.layout.daemon_socket)).get(
                "ForkParent", "pl-base")[0].status.snapshot)["status"] == "ready"
        for body in [*pools, pinned]:
            name = body["metadata"]["name"]
            (node,) = expected[name]
            assert body["status"]["node"] == node
            here, there = two_nodes[node], two_nodes["b" if node == "a" else "a"]
            kids = [r for r in here.children() if r.pool == name and r.status == "running"]
            assert len(kids) == 1 and here.ping(kids[0].id)["child_id"] == kids[0].id
            assert not [r for r in there.children() if r.pool == name]
            with pytest.raises(NotFound):
                handlers.daemon(str(there.layout.daemon_socket)).get("ForkPool", name)
    finally:
        for body in [*pools, pinned, parent]:
            call(handlers.release, body, wait=120)
    for rt_ in two_nodes.values():
        sock = str(rt_.layout.daemon_socket)
        for body in bodies:
            with pytest.raises(NotFound):
                handlers.daemon(sock).get(body["kind"], body["metadata"]["name"])


def test_branch_of_a_child_id_needs_a_pin_with_several_nodes(two_nodes):
    from forkd.base.errors import InvalidInput

    body = {"kind": "ForkBranch", "metadata": {"name": "b1", "namespace": "default"},
            "spec": {"sandbox": "c0123456789"}}
    with pytest.raises(InvalidInput, match="needs the annotation"):
        handlers.place(body)
    body["spec"]["sandbox"] = "pool/pl-pool0"
    assert handlers.place(body) == handlers.place(resource("ForkPool", "pl-pool0", {"from": "x"}))
