"""`forkd gc` of one FORKD_HOME never takes another home's network namespace, veth or lease, whatever its grace (two
homes on one host: tests on several workers, a crash harness's parallel seeds, two daemons), and never a spawn's
that runs while it scans. Real namespaces, veths and leases made by forkd.sandbox.netns for homes this test makes
and removes; no VM. Needs root (CAP_NET_ADMIN), as every isolated child does."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.sandbox import gc, netns
from forkd.sandbox.netlayout import leases_dir
from forkd.sandbox.registry import ChildRecord, Registry, this_process


@pytest.fixture
def homes():
    """Two fresh homes on this host (short paths under /tmp, as a user's would be), removed after the test."""
    made = [Path(tempfile.mkdtemp(prefix="fkg", dir="/tmp")) for _ in range(2)]
    yield [Layout(h) for h in made]
    for h in made:
        shutil.rmtree(h, ignore_errors=True)


@pytest.fixture
def nets():
    """Child networks a test sets up, torn down after it whatever gc did to them."""
    made: list[netns.ChildNet] = []
    yield made
    for net in made:
        netns.teardown(net)


def child_net(nets: list, layout: Layout) -> netns.ChildNet:
    """A child's namespace, veth and lease of `layout`'s home, as a spawn makes them."""
    net, _ = netns.setup("c" + secrets.token_hex(5), str(layout.home))
    nets.append(net)
    return net


def present(net: netns.ChildNet) -> dict[str, bool]:
    return {"netns": netns.exists(net.netns), "veth": net.host_if in netns.host_links(),
            "lease": (leases_dir() / net.addr).exists()}


def test_a_namespace_is_named_by_its_home():
    a, b = netns.netns_name("c0123456789", "/tmp/a"), netns.netns_name("c0123456789", "/tmp/b")
    assert a != b and netns.parse_netns(a)[1] == netns.parse_netns(b)[1] == "c0123456789"
    assert netns.parse_netns("forkd-c0123456789") == (None, "c0123456789")  # an older forkd's name


def test_gc_with_no_grace_leaves_another_homes_leaseless_namespace_and_takes_its_own(homes, nets):
    """A namespace whose lease is gone (what gc of another home saw of a spawn mid-way before leases were written
    whole and read after the kernel's objects): only its own home's gc may take it, veth included."""
    a, b = homes
    theirs, mine = child_net(nets, b), child_net(nets, a)
    for net in (theirs, mine):
        (leases_dir() / net.addr).unlink()
    report = gc.collect(a, grace=0)
    assert present(theirs) == {"netns": True, "veth": True, "lease": False}, report.to_json()
    assert theirs.netns not in report.netns and theirs.host_if not in report.veths
    assert present(mine) == {"netns": False, "veth": False, "lease": False}, report.to_json()
    assert mine.netns in report.netns
    gc.collect(b, grace=0)
    assert present(theirs) == {"netns": False, "veth": False, "lease": False}


def test_gc_with_no_grace_leaves_a_spawn_made_while_it_lists_namespaces(homes, nets, monkeypatch):
    """A spawn of gc's own home that begins after gc read the registry (record, then lease, namespace and veth, as
    forkd.sandbox.supervisor makes them) while gc lists the namespaces: its lease and record are read after, so
    nothing of it is taken."""
    a, _ = homes
    spawned: list[netns.ChildNet] = []
    list_netns = netns.list_netns

    def spawn_then_list() -> list[str]:
        if not spawned:
            cid, (pid, started) = "c" + secrets.token_hex(5), this_process()
            Registry(a).save(ChildRecord(id=cid, snapshot="s", created_at=time.time(), dir="", memory_mib=64,
                                         vcpus=1, accel="tcg", spawner_pid=pid, spawner_started=started,
                                         network="isolated", netns=netns.netns_name(cid, str(a.home))))
            net, _ = netns.setup(cid, str(a.home))
            nets.append(net)
            spawned.append(net)
        return list_netns()

    monkeypatch.setattr(netns, "list_netns", spawn_then_list)
    report = gc.collect(a, grace=0)
    assert spawned and present(spawned[0]) == {"netns": True, "veth": True, "lease": True}, report.to_json()


def test_a_lease_is_never_seen_half_written(homes, nets, monkeypatch):
    """Whoever reads the leases while one is being written (another home's gc) sees it whole or not at all: a
    lease it cannot read names no home, and a reader that took it for garbage freed a live child's address."""
    a, _ = homes
    before = {p for p, lease in netns.leases() if lease is None}
    seen: list[list] = []
    dump = netns.json.dump

    def look_then_dump(obj, f, **kw):  # the file being written exists, empty: can a reader find it?
        seen.append([p for p, lease in netns.leases() if lease is None and p not in before])
        return dump(obj, f, **kw)

    monkeypatch.setattr(netns.json, "dump", look_then_dump)
    net = child_net(nets, a)
    monkeypatch.undo()
    assert seen and seen == [[]] * len(seen)
    assert json.loads((leases_dir() / net.addr).read_text())["netns"] == net.netns
    assert not [p for p in leases_dir().iterdir() if p.name.startswith(f".lease-{os.getpid()}@")]  # none left
