"""Leak-free cleanup with real VMs and namespaces: kill -9 the process that spawned 5 isolated children, then
`forkd gc` adopts the live, recorded children (they keep answering) and, once their records are gone too, removes
every namespace, veth, tap, lease, cgroup, socket directory and QEMU process of theirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from forkd.sandbox import cgroups, gc, netns
from tests.conftest import forkd_cli, qemu_pids
from tests.test_isolation import NET_TAG, net_snapshot

pytestmark = pytest.mark.vm

SPAWNER = """
import os, sys, time
from forkd.core.requests import Spawn
from forkd.core.runtime import Runtime
rt = Runtime()
recs = rt.fork(Spawn.of(tag=sys.argv[1], n=5, memory_limit_mib=256))
print(" ".join(r.id for r in recs), flush=True)
time.sleep(600)
"""


def leftovers(rt, ids):
    home = str(rt.layout.home)
    return {
        "netns": [n for n in netns.list_netns() if netns.child_of(n) in ids],
        "veths": [v for v in netns.host_links() if v in {netns.host_if_name(i) for i in ids}],
        "leases": [lease.addr for _, lease in netns.leases() if lease and lease.child in ids],
        "cgroups": [str(g) for g in cgroups.home_groups(home) if g.name in ids],
        "dirs": [i for i in ids if (rt.layout.children / i).exists()],
        "qemu": qemu_pids(rt.layout.home),
    }


def test_kill_9_spawner_then_gc_adopts_then_cleans_everything(rt, home):
    net_snapshot(rt)
    proc = subprocess.Popen([sys.executable, "-c", SPAWNER, NET_TAG], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    ids = proc.stdout.readline().split()
    assert len(ids) == 5
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the children outlive their spawner: recorded, alive -> adopted, and they keep answering
    report = gc.collect(rt.layout)
    assert set(ids) <= set(report.adopted)
    assert not (set(report.reaped) & set(ids))
    for i in ids:
        assert rt.ping(i)["pong"] is True
    left = leftovers(rt, set(ids))
    assert len(left["netns"]) == 5 and len(left["cgroups"]) == 10 or len(left["cgroups"]) == 5
    # now lose the records as well (a wiped registry): gc finds the VMMs by namespace / cgroup membership
    for i in ids:
        (rt.layout.children / i / "child.json").unlink()
    res = forkd_cli("gc", "--grace", "0", "-o", "json", check=True)
    out = json.loads(res.stdout)
    assert len(out["processes"]) >= 5 and len(out["netns"]) == 5
    left = leftovers(rt, set(ids))
    assert not any(left.values()), left


def test_kill_9_mid_spawn_leaves_nothing_unaccounted(rt, home):
    net_snapshot(rt)
    before = set(os.listdir(rt.layout.children))
    proc = subprocess.Popen([sys.executable, "-c", SPAWNER, NET_TAG], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    deadline = time.monotonic() + 60  # mid-way: some children recorded and starting, some namespaces made
    while set(os.listdir(rt.layout.children)) <= before and time.monotonic() < deadline:  # a loaded host is slow
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    report = gc.collect(rt.layout, grace=0)
    live = {r.id for r in rt.children() if r.status == "running"}
    assert set(report.adopted) == live
    # whatever is left belongs to an adopted, answering child
    for i in live:
        assert rt.ping(i)["pong"] is True
    mine = [n for n in netns.list_netns() if (rt.layout.children / netns.child_of(n)).exists()]
    assert {netns.child_of(n) for n in mine} <= live
    assert {g.name for g in cgroups.home_groups(str(home))} <= live
    assert len(qemu_pids(home)) == len(live)
    if live:  # killed before any child answered: nothing left to adopt
        rt.kill(list(live))
    assert gc.collect(rt.layout, dry_run=True, grace=0).leftovers == 0
    assert not qemu_pids(home)
