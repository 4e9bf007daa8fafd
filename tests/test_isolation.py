"""Per-child isolation with real VMs and real namespaces: a child reaches a host service on the bridge that its
egress allows (the default reaches nothing: tests/security/test_network.py), children cannot reach each other,
nothing listens in the guest, a child past its memory limit is OOM-killed alone, and cgroup placement fails
closed."""

from __future__ import annotations

import http.server
import os
import threading
import time

import pytest

from forkd.base.errors import ForkdError, InvalidInput
from forkd.core.requests import ParentBuild, Spawn
from forkd.sandbox import cgroups, netlayout, netns
from tests.conftest import BASE_TAG, qemu_pids

pytestmark = pytest.mark.vm
NET_TAG = "netbase"


def net_snapshot(rt):
    """One parent built with network: isolated, shared by test_isolation and test_gc (built once per session)."""
    try:
        snap = rt.store.get(NET_TAG)
        if snap.status == "ready":
            return snap
    except ForkdError:
        pass
    return rt.create_snapshot(ParentBuild.of(tag=NET_TAG, memory_mib=512, network="isolated"))


@pytest.fixture(scope="module")
def netbase(rt):
    return net_snapshot(rt)


@pytest.fixture
def nfork(rt, netbase):
    made = []

    def _fork(n=1, **kw):
        recs = rt.fork(Spawn.of(tag=NET_TAG, n=n, **kw))
        made.extend(recs)
        return recs

    yield _fork
    ids = [r.id for r in made if (rt.layout.children / r.id).exists()]
    if ids:
        rt.kill(ids)


@pytest.fixture(scope="module")
def host_http():
    """python's http.server bound to the bridge address only (never anything outside this machine)."""
    netns.ensure_host()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b"hello-from-host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer((netlayout.BRIDGE_ADDR, 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://{netlayout.BRIDGE_ADDR}:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


def host_allow(url: str) -> dict:
    """The egress that lets a child reach the host service at `url` (and nothing else)."""
    return {"allow": [f"{netlayout.BRIDGE_ADDR}/32:{url.rsplit(':', 1)[1].strip('/')}"]}


def sh(rt, cid, cmd, timeout=30):
    return rt.exec(cid, ["sh", "-c", cmd], timeout=timeout)


def http_get(rt, cid, url, timeout=5):
    """GET from inside the guest with its Python (the static busybox's wget crashes resolving names)."""
    code = ("import urllib.request\n"
            f"try:\n    R = urllib.request.urlopen({url!r}, timeout={timeout}).read().decode()\n"
            "except Exception as e:\n    R = 'ERR ' + type(e).__name__")
    rt.exec_code(cid, code, timeout=timeout + 10)
    return rt.eval(cid, "R", timeout=10)["value"]


def test_isolated_child_reaches_host_service_and_listens_on_nothing(rt, nfork, host_http):
    (c,) = nfork(1, egress=host_allow(host_http))
    assert c.network == "isolated" and c.netns == netns.netns_name(c.id, str(rt.layout.home)) and netns.exists(c.netns)
    assert "hello-from-host" in http_get(rt, c.id, host_http)
    # the guest keeps the parent's address and MAC
    res = sh(rt, c.id, "cat /sys/class/net/eth0/address; ip -4 addr show eth0")
    assert "52:54:00:12:34:56" in res["stdout"] and "10.42.0.2/24" in res["stdout"]
    # nothing listens inside the guest: no TCP/UDP socket in LISTEN state (0A) or bound for UDP
    res = sh(rt, c.id, "cat /proc/net/tcp /proc/net/tcp6 /proc/net/udp 2>/dev/null | awk 'NR>1 && $4==\"0A\"'")
    assert res["stdout"].strip() == "", res


def test_children_cannot_reach_each_other(rt, nfork, host_http):
    a, b = nfork(2, egress={"allow": [*host_allow(host_http)["allow"], "10.200.0.0/16:80"]})
    assert a.net_addr != b.net_addr
    assert "hello-from-host" in http_get(rt, a.id, host_http)  # its network works: it reaches what it may
    for target in (b.net_addr,):
        res = sh(rt, a.id, f"ping -c 2 -W 2 {target}")
        assert res["exit_code"] != 0, f"child {a.id} reached its sibling at {target}: {res}"
        assert http_get(rt, a.id, f"http://{target}:80/", timeout=3).strip("'\"").startswith("ERR")
    # the host side of each pair is an isolated bridge port
    for c in (a, b):
        out = os.popen(f"bridge -d link show dev {netns.host_if_name(c.id)}").read()
        assert "isolated on" in out, out


def test_oom_kills_only_the_child_past_its_limit(rt, nfork):
    limit = 160  # measured: a restored child uses 30-50 MiB of its own before it does anything
    hog, neighbour = nfork(2, memory_limit_mib=limit)
    g = cgroups.from_record(hog.cgroup)
    assert g is not None and hog.memory_limit_mib == limit
    with open(os.path.join(hog.cgroup[0], "memory.limit_in_bytes" if g.version == 1 else "memory.max")) as f:
        assert int(f.read()) == limit << 20
    with pytest.raises(ForkdError):
        rt.exec_code(hog.id, "x = bytearray(200 << 20)", timeout=60)
    deadline = time.monotonic() + 10
    while rt.child(hog.id).status != "oom-killed" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rt.child(hog.id).status == "oom-killed"
    assert rt.ping(neighbour.id)["pong"] is True
    assert rt.eval(neighbour.id, "6 * 7")["value"] == "42"
    assert rt.child(neighbour.id).status == "running"


def test_placement_fails_closed_unless_allowed(rt, base, nfork, monkeypatch, home):
    before = set(qemu_pids(home))
    monkeypatch.setenv("FORKD_CGROUP_ROOT", str(home / "no-cgroups-here"))
    with pytest.raises(ForkdError, match="cannot be constrained"):
        rt.fork(Spawn.of(tag=BASE_TAG, n=1, memory_limit_mib=256))
    assert set(qemu_pids(home)) <= before
    assert not [r for r in rt.children() if r.snapshot == BASE_TAG and r.state == "failed"]
    (c,) = nfork(1, memory_limit_mib=256, allow_unconstrained=True)  # explicitly allowed
    assert c.unconstrained and c.cgroup is None and rt.ping(c.id)["pong"]


def test_network_mode_must_match_the_parent(rt, netbase, base):
    with pytest.raises(InvalidInput, match="without a network device"):
        rt.fork(Spawn.of(tag=BASE_TAG, n=1, network="isolated"))
    with pytest.raises(InvalidInput, match="has a network device"):
        rt.fork(Spawn.of(tag=NET_TAG, n=1, network="none"))


def test_kill_removes_namespace_veth_tap_and_cgroup(rt, nfork):
    (c,) = nfork(1, memory_limit_mib=256)
    assert netns.exists(c.netns) and netns.host_if_name(c.id) in netns.host_links()
    assert all(os.path.isdir(p) for p in c.cgroup)
    rt.kill([c.id])
    assert not netns.exists(c.netns)
    assert netns.host_if_name(c.id) not in netns.host_links()
    assert not any(os.path.exists(p) for p in c.cgroup)
    assert not (netlayout.leases_dir() / c.net_addr).exists()


def test_vmm_hardening_private_dir_and_unprivileged_uid(rt, nfork, monkeypatch, host_http):
    (c,) = nfork(1)
    d = os.stat(c.dir)
    assert d.st_uid == 0 and (d.st_mode & 0o777) == 0o700  # sockets live in a 0700 directory
    assert (os.stat(rt.layout.children).st_mode & 0o777) == 0o700
    cmd = open(f"/proc/{c.pid}/cmdline", "rb").read().split(b"\0")
    assert b"-sandbox" in cmd and any(b"spawn=deny" in a for a in cmd)
    # opt-in: the VMM drops to a uid of its own once its files, sockets and tap are open (-runas uid:gid)
    monkeypatch.setenv("FORKD_VMM_RUNAS", "per-child")
    (u,) = nfork(1, egress=host_allow(host_http))
    uid = int(u.runas.split(":")[0])
    status = open(f"/proc/{u.pid}/status").read()
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in status, status
    assert rt.eval(u.id, "6 * 7")["value"] == "42"
    assert "hello-from-host" in http_get(rt, u.id, host_http)
