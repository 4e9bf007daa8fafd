"""Child -> network (issue 14, finding 5), attacked from inside real isolated children.

The whole lab runs in a network namespace of its own (`unshare --net`: the process below, with forkd's host side,
bridge, children and the host's ip_forward=1 of a Kubernetes node) plus an "outside" namespace it makes that owns
169.254.169.254 (cloud metadata), 192.168.77.1 (RFC 1918), 198.51.100.1 (TEST-NET-2, "the internet"), fd42::1
(ULA) and a link-local address, each with TCP listeners. The lab's default route leads there and nowhere else, so
no packet can leave this machine. The host plays a node with services bound to 0.0.0.0 / [::] on the same ports.

Each child (network: isolated) tries every target from its guest as root would, IPv6 included (it gives itself a
ULA address and an on-link default route). Default egress reaches nothing; `internet` reaches only the public
address; `{allow: [CIDR:port]}` reaches exactly what it lists.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forkd.base.errors import ForkdError, InvalidInput
from forkd.core.requests import Spawn
from forkd.spec.models import ForkPool
from tests.security.netlab import lab_main, run_lab

PORT, OTHER_PORT = 7777, 7778
METADATA, PRIVATE, PUBLIC = "169.254.169.254", "192.168.77.1", "198.51.100.1"
UPLINK_OUT, UPLINK_HOST = "192.0.2.1", "192.0.2.2"  # the lab's link to the outside (TEST-NET-1)
ULA, ULA_HOST, OUT_LL = "fd42::1", "fd99::2", "fe80::1"
BRIDGE_ADDR = "10.200.0.1"
ALLOW = {"allow": [f"{PRIVATE}/32:{PORT}", f"{BRIDGE_ADDR}/32:{PORT}"]}
POLICIES = {"default": None, "internet": "internet", "allow": ALLOW}


# -- the lab (runs as `unshare --net python -m ...test_network LAB.json`) ---------------------------------
def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _listen(addrs: list[str], port: int, banner: str) -> None:
    """TCP listeners answering `banner@<address reached>` (daemon threads: gone with the lab)."""
    for addr in addrs:
        fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((addr, port))
        s.listen(64)

        def serve(s: socket.socket = s) -> None:
            while True:
                c, _ = s.accept()
                with c:
                    c.sendall(f"{banner}@{c.getsockname()[0]}".encode())

        threading.Thread(target=serve, daemon=True).start()


def _outside(name: str) -> None:
    """The outside world: a namespace owning the target addresses, our only route out."""
    from forkd.sandbox import netns

    _ip("netns", "add", name)
    _ip("link", "add", "fkt-up", "type", "veth", "peer", "name", "fkt-world", "netns", name)
    _ip("addr", "add", f"{UPLINK_HOST}/24", "dev", "fkt-up")
    _ip("-6", "addr", "add", f"{ULA_HOST}/64", "dev", "fkt-up", "nodad")
    _ip("link", "set", "fkt-up", "up")
    for cmd in (["link", "set", "lo", "up"], ["link", "set", "fkt-world", "up"],
                ["addr", "add", f"{UPLINK_OUT}/24", "dev", "fkt-world"],
                ["-6", "addr", "add", "fd99::1/64", "dev", "fkt-world", "nodad"],
                ["-6", "addr", "add", f"{OUT_LL}/64", "dev", "fkt-world", "nodad"],
                *(["addr", "add", f"{a}/32", "dev", "lo"] for a in (METADATA, PRIVATE, PUBLIC)),
                ["-6", "addr", "add", f"{ULA}/128", "dev", "lo", "nodad"]):
        _ip("-n", name, *cmd)
    _ip("route", "add", "default", "via", UPLINK_OUT)
    _ip("-6", "route", "add", "default", "via", "fd99::1")
    with netns.inside(name):  # sockets made here stay in the outside namespace
        for port in (PORT, OTHER_PORT):
            _listen(["0.0.0.0", "::"], port, "outside")


def _targets(bridge_ll: str | None) -> dict[str, tuple[str, int]]:
    t = {"metadata": (METADATA, PORT), "private": (PRIVATE, PORT), "private_other_port": (PRIVATE, OTHER_PORT),
         "public": (PUBLIC, PORT), "public_other_port": (PUBLIC, OTHER_PORT),
         "host_bridge": (BRIDGE_ADDR, PORT), "host_bridge_other_port": (BRIDGE_ADDR, OTHER_PORT),
         "host_uplink": (UPLINK_HOST, PORT), "ula": (ULA, PORT), "ula_host": (ULA_HOST, PORT),
         "outside_link_local": (f"{OUT_LL}%eth0", PORT)}
    if bridge_ll:
        t["host_bridge_link_local"] = (f"{bridge_ll}%eth0", PORT)
    return t


PROBE = """
import json, socket, threading
T = {targets!r}
R = {{}}
def probe(name, host, port):
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        s = socket.socket(info[0], socket.SOCK_STREAM)
        s.settimeout(8)
        s.connect(info[4])
        R[name] = "ok:" + s.recv(100).decode()
        s.close()
    except Exception as e:
        R[name] = "ERR " + type(e).__name__
ts = [threading.Thread(target=probe, args=(n, h, p)) for n, (h, p) in T.items()]
[t.start() for t in ts]
[t.join() for t in ts]
R = json.dumps(R)
"""

GUEST_V6 = ("ip -6 addr add fd42:42::2/64 dev eth0 nodad 2>&1; ip -6 route add ::/0 dev eth0 2>&1; "
            "ip -6 addr show dev eth0 2>&1; cat /proc/net/if_inet6 2>&1 | head -5")


def _probe_child(rt, cid: str, targets: dict) -> dict:
    rt.exec(cid, ["sh", "-c", GUEST_V6], timeout=30)  # the attacker is root in its guest: it tries IPv6 too
    rt.exec_code(cid, PROBE.format(targets=targets), timeout=120)
    return json.loads(ast.literal_eval(rt.eval(cid, "R", timeout=30)["value"]))


def _bridge_link_local() -> str | None:
    out = subprocess.run(["ip", "-6", "-o", "addr", "show", "dev", "forkd0", "scope", "link"], capture_output=True,
                         text=True).stdout.split()
    return out[3].split("/")[0] if len(out) > 3 else None


def _set(name: str) -> str:
    return subprocess.run(["nft", "list", "set", "inet", "forkd_host", name], capture_output=True, text=True).stdout


def _stale_grant() -> dict:
    """A spawner died after granting 10.200.250.250 `internet` and its lease went (gc): the next child leased that
    address must not inherit the grant."""
    from forkd.sandbox import firewall, netns

    addr = "10.200.250.250"
    firewall.grant(addr, "internet")
    granted = addr in _set("internet4")
    listed = [p.name for p, _ in netns.leases()]
    real = netns.secrets.randbelow
    netns.secrets.randbelow = lambda n: 250 * 256 + 250 - 4  # _lease's first pick (index = pick + 4)
    try:
        net = netns._lease(netns.ChildNet("forkd-cstale", "fkhstale", "", "/nonexistent", "cstale"))
    finally:
        netns.secrets.randbelow = real
    inherited = addr in _set("internet4")
    netns.release(net.addr, net.netns)
    return {"granted": granted, "leased": net.addr, "inherited": inherited, "listed_as_lease": listed}


def lab(tag: str) -> dict:
    from forkd.base.paths import Layout
    from forkd.client.wire import child_view, sandbox_info
    from forkd.core.runtime import Runtime
    from forkd.sandbox import netns

    _ip("link", "set", "lo", "up")
    for key in ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"):  # a Kubernetes node; this namespace only
        Path("/proc/sys", key).write_text("1")
    outside = f"fkt-out-{secrets.token_hex(3)}"
    rt = Runtime(Layout(Path(os.environ["FORKD_HOME"])))
    made, out = [], {}
    try:
        _outside(outside)
        netns.ensure_host()
        _listen(["0.0.0.0", "::"], PORT, "host")  # a node's services bound to every address
        _listen(["0.0.0.0", "::"], OTHER_PORT, "host")
        for name, egress in POLICIES.items():
            try:
                (rec,) = rt.fork(Spawn.of(tag=tag, n=1, **({"egress": egress} if egress else {})))
            except ForkdError as exc:  # (a forkd without egress refuses the field)
                out[name] = {"error": str(exc), "reached": {}}
                continue
            made.append(rec.id)
            ns_rules = subprocess.run(["ip", "netns", "exec", rec.netns, "nft", "list", "table", "inet", "forkd"],
                                      capture_output=True, text=True).stdout
            out[name] = {"record": getattr(rec, "egress", None),
                         "view": child_view(rec).get("egress"), "sandbox": sandbox_info(rec).model_dump().get("egress"),
                         "netns_rules": ns_rules, "child": rec.id, "addr": rec.net_addr}
        targets = _targets(_bridge_link_local())
        probed = [name for name in POLICIES if "child" in out.get(name, {})]
        with ThreadPoolExecutor(max(1, len(probed))) as pool:  # at once: each probe waits out what is dropped
            for name, reached in zip(probed, pool.map(lambda n: _probe_child(rt, out[n]["child"], targets), probed),
                                     strict=True):
                out[name]["reached"] = reached
        out["host_rules"] = subprocess.run(["nft", "list", "table", "inet", "forkd_host"], capture_output=True,
                                           text=True).stdout
        out["stale_grant"] = _stale_grant()
    finally:
        if made:
            rt.kill(made)
        out["grants_left"] = subprocess.run(["nft", "list", "set", "inet", "forkd_host", "allow4"],
                                            capture_output=True, text=True).stdout
        subprocess.run(["ip", "netns", "del", outside], capture_output=True)
    return out


# -- the tests ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def results(rt, home):
    from tests.test_isolation import NET_TAG, net_snapshot

    net_snapshot(rt)
    return run_lab("tests.security.test_network", [NET_TAG], home, timeout=900)


def reached(results: dict, policy: str) -> set[str]:
    return {k for k, v in results[policy]["reached"].items() if v.startswith("ok:")}


@pytest.mark.vm
def test_default_egress_reaches_no_metadata_private_host_or_ipv6(results):
    got = results["default"]["reached"]
    assert "metadata" in got and "host_bridge" in got and "ula" in got
    assert reached(results, "default") == set(), got


@pytest.mark.vm
def test_default_egress_denies_cloud_metadata(results):
    assert not results["default"]["reached"]["metadata"].startswith("ok:"), results["default"]["reached"]


@pytest.mark.vm
def test_default_egress_denies_host_services_on_the_bridge(results):
    r = results["default"]["reached"]
    assert not r["host_bridge"].startswith("ok:") and not r["host_uplink"].startswith("ok:"), r


@pytest.mark.vm
def test_ipv6_is_denied_under_every_policy(results):
    for policy in POLICIES:
        r = results[policy]["reached"]
        v6 = {k: v for k, v in r.items() if k in ("ula", "ula_host", "outside_link_local", "host_bridge_link_local")}
        assert v6 and not any(v.startswith("ok:") for v in v6.values()), (policy, v6)


@pytest.mark.vm
def test_internet_reaches_public_addresses_only(results):
    r = results["internet"]["reached"]
    assert r["public"] == f"ok:outside@{PUBLIC}" and r["public_other_port"].startswith("ok:"), r
    assert reached(results, "internet") == {"public", "public_other_port"}, r  # no metadata, private, host, IPv6


@pytest.mark.vm
def test_allow_list_reaches_exactly_what_it_names(results):
    r = results["allow"]["reached"]
    assert r["private"] == f"ok:outside@{PRIVATE}" and r["host_bridge"] == f"ok:host@{BRIDGE_ADDR}", r
    assert reached(results, "allow") == {"private", "host_bridge"}, r  # not the other port, not the rest


@pytest.mark.vm
def test_egress_is_recorded_and_shown(results):
    assert results["default"]["record"] == "none" and results["default"]["sandbox"] == "none"
    assert results["internet"]["view"] == "internet" and results["internet"]["sandbox"] == "internet"
    want = {"allow": [f"{PRIVATE}/32:{PORT}", f"{BRIDGE_ADDR}/32:{PORT}"]}
    assert results["allow"]["record"] == want and results["allow"]["view"] == want
    assert results["allow"]["sandbox"] == want


@pytest.mark.vm
def test_rules_are_forkds_own_tables_and_grants_go_with_the_child(results):
    host = results["host_rules"]
    assert "table inet forkd_host" in host and "@allow4 accept" in host and "169.254.0.0/16" in host
    assert "meta nfproto ipv6 drop" in host
    assert "chain egress" in results["default"]["netns_rules"] and "policy drop" in results["default"]["netns_rules"]
    assert results["allow"]["addr"] in host  # the allow list's grant, keyed by the child's address ...
    assert results["allow"]["addr"] not in results["grants_left"]  # ... is taken back when it is killed


@pytest.mark.vm
def test_a_dead_childs_grant_is_not_inherited_by_the_next_lease_of_its_address(results):
    s = results["stale_grant"]
    assert s["granted"] and s["leased"] == "10.200.250.250", s
    assert not s["inherited"], s
    assert not any(n.endswith(".grants") for n in s["listed_as_lease"]), s  # gc never takes it for a bad lease


# -- the declarative side (no VM) ------------------------------------------------------------------------------
def test_egress_spec_is_validated_and_reaches_the_request():
    from forkd.core.requests import egress_json

    pool = ForkPool(metadata={"name": "p"}, spec={"from": "x", "child": {"network": "isolated",
                                                                       "egress": {"allow": ["10.1.2.3:5432"]}}})
    req = pool.to_request("t", 1)
    assert egress_json(req.egress) == {"allow": ["10.1.2.3/32:5432"]}
    assert ForkPool(metadata={"name": "p"}, spec={"from": "x"}).to_request("t", 1).egress == "none"
    for bad, why in (("open", "'none' or 'internet'"), ({"allow": ["fd00::/8:80"]}, "IPv6 is always denied"),
                     ({"allow": ["10.0.0.1/8:80"]}, "host bits set"), ({"allow": ["10.0.0.0/8"]}, "CIDR:port"),
                     ({"allow": ["10.0.0.0/8:0"]}, "port must be"), ({"allow": []}, "at least 1")):
        with pytest.raises(InvalidInput, match=why):
            Spawn.of(tag="t", egress=bad)
    with pytest.raises(ValueError, match="isolated children only"):  # a child without a NIC has no egress to open
        ForkPool(metadata={"name": "p"}, spec={"from": "x", "child": {"egress": "internet"}})


def test_egress_rules_are_built_from_the_policy():
    from forkd.sandbox import firewall

    egress_chain = firewall.netns_rules("none").split("chain egress")[1]
    assert "accept" not in egress_chain.replace("established,related accept", "")
    assert firewall.host_grants("10.200.1.2", "none") == []
    assert firewall.host_grants("10.200.1.2", "internet") == ["internet4 { 10.200.1.2 }"]
    assert firewall.host_grants("10.200.1.2", {"allow": ["10.0.0.0/8:5432-5440"]}) == [
        "allow4 { 10.200.1.2 . 10.0.0.0/8 . tcp . 5432-5440 }", "allow4 { 10.200.1.2 . 10.0.0.0/8 . udp . 5432-5440 }"]
    assert "169.254.0.0/16" in firewall.netns_rules("internet") and "ip daddr 10.0.0.0/8" in firewall.netns_rules(
        {"allow": ["10.0.0.0/8:1"]})


if __name__ == "__main__":  # the lab, inside `unshare --net`
    lab_main(lab)
