"""Egress asked for per sandbox, through every front door: the SDK (`Sandbox.create(egress=...)`,
`allow_internet_access=`, `sb.fork()`), the CLI (`forkd fork --egress`, `--from-sandbox`) and MCP
(`spawn_sandboxes(egress=...)`), all through the daemon's REST API, and enforced in real isolated children.

The lab is tests/security/test_network.py's: this process in a network namespace of its own (`unshare --net`) and
an "outside" namespace it makes owning a private (192.168.77.1) and a "public" (TEST-NET-2) address with TCP
listeners on two ports; no packet can leave this machine. The daemon's app serves on a unix socket of the lab's
own (the daemon's start-up gc is not run: it would see other homes' namespaces under a run directory that is not
theirs). Each child probes every target from its guest; the default reaches nothing.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput
from tests.security.netlab import lab_main, run_lab
from tests.security.test_network import OTHER_PORT, PORT, PRIVATE, PUBLIC, _ip, _listen, _outside

pytestmark = pytest.mark.vm

BRIDGE_ADDR = "10.200.0.1"
TARGETS = {"private": (PRIVATE, PORT), "private_other_port": (PRIVATE, OTHER_PORT), "public": (PUBLIC, PORT),
           "host_bridge": (BRIDGE_ADDR, PORT)}
ALLOW_PRIVATE = {"allow": [f"{PRIVATE}/32:{PORT}"]}
PROBE = """
import json, socket, threading
R = {{}}
def probe(name, host, port):
    try:
        s = socket.create_connection((host, port), timeout=8)
        R[name] = "ok:" + s.recv(100).decode()
        s.close()
    except Exception as e:
        R[name] = "ERR " + type(e).__name__
ts = [threading.Thread(target=probe, args=(n, h, p)) for n, (h, p) in {targets!r}.items()]
[t.start() for t in ts]
[t.join() for t in ts]
R = json.dumps(R)
"""


# -- the lab (runs as `unshare --net python -m ...test_egress_per_sandbox NET_TAG PLAIN_TAG OUT.json`) -----------
def _probe(rt, cid: str) -> dict[str, str]:
    rt.exec_code(cid, PROBE.format(targets=TARGETS), timeout=120)
    return json.loads(ast.literal_eval(rt.eval(cid, "R", timeout=30)["value"]))


def _serve(rt, sock_path: Path):
    """The daemon's app on a unix socket of the lab's (bound before the server thread runs: connects queue)."""
    import uvicorn

    from forkd.api.app import create_app
    from forkd.api.daemon import bind_unix
    from forkd.reconciler.control import Control

    usock = bind_unix(sock_path, sock_path.parent)
    server = uvicorn.Server(uvicorn.Config(create_app(Control(rt)), log_level="warning", log_config=None,
                                           ws="none"))
    threading.Thread(target=server.run, kwargs={"sockets": [usock]}, daemon=True).start()
    return server


def _refusals(sock: str, plain_tag: str, net_tag: str) -> dict[str, str]:
    from forkd_client import Sandbox

    out = {}
    for name, kw in (("no_nic", {"template": plain_tag, "egress": "internet"}),
                     ("ipv6", {"template": net_tag, "egress": {"allow": ["fd00::/8:80"]}}),
                     ("not_a_policy", {"template": net_tag, "egress": "open"}),
                     ("pool_and_egress", {"pool": "p", "egress": "internet"})):
        try:
            Sandbox.create(socket=sock, **kw).kill()
            out[name] = "accepted"
        except (InvalidInput, ValueError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


async def _mcp_spawn(net_tag: str) -> dict:
    from forkd.mcp.server import build
    from tests.test_mcp import _data

    return _data(await build().call_tool("spawn_sandboxes", {"snapshot_tag": net_tag, "egress": "internet"}))


def _children(rt, sock: str, net_tag: str) -> dict[str, str]:
    """A child per front door; returns {case: child id}."""
    from forkd_client import Sandbox

    made = {"allow": Sandbox.create(template=net_tag, socket=sock, egress=ALLOW_PRIVATE).id,
            "default": Sandbox.create(template=net_tag, socket=sock).id,
            "e2b_internet": Sandbox.create(template=net_tag, socket=sock, allow_internet_access=True).id}
    made["allow_forked"] = Sandbox.connect(made["allow"], socket=sock).fork(1)[0].id
    cli = _cli("fork", "--tag", net_tag, "--egress", f"{PRIVATE}/32:{OTHER_PORT}", "-o", "json")
    assert cli.returncode == 0, cli.stderr
    made["cli"] = json.loads(cli.stdout)["children"][0]["id"]
    cli = _cli("fork", "--from-sandbox", made["cli"], "--egress", "none", "-o", "json")
    assert cli.returncode == 0, cli.stderr
    made["cli_forked_none"] = json.loads(cli.stdout)["children"][0]["id"]
    made["mcp"] = asyncio.run(_mcp_spawn(net_tag))["sandboxes"][0]["id"]
    return made


def lab(net_tag: str, plain_tag: str) -> dict:
    from forkd.base.paths import Layout
    from forkd.core.runtime import Runtime
    from forkd.sandbox import netns

    _ip("link", "set", "lo", "up")
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")  # a Kubernetes node's; this namespace only
    outside = f"fkt-out-{secrets.token_hex(3)}"
    rt = Runtime(Layout(Path(os.environ["FORKD_HOME"])))
    sock_dir = Path(tempfile.mkdtemp(prefix="fkt-api-"))
    sock = sock_dir / "forkd.sock"
    os.environ["FORKD_DAEMON_SOCKET"] = str(sock)  # the CLI and MCP find the lab's daemon by it
    out: dict = {"refused": {}, "cli_bad": {}, "children": {}}
    made: dict[str, str] = {}
    server = None
    try:
        _outside(outside)
        netns.ensure_host()
        _listen(["0.0.0.0"], PORT, "host")
        server = _serve(rt, sock)
        out["refused"] = _refusals(str(sock), plain_tag, net_tag)
        bad = _cli("fork", "--tag", net_tag, "--egress", "internet", "--egress", "10.0.0.0/8:5432")
        out["cli_bad"] = {"rc": bad.returncode, "stderr": bad.stderr[-800:]}
        made = _children(rt, str(sock), net_tag)
        with ThreadPoolExecutor(len(made)) as pool:  # at once: each probe waits its timeout on what is dropped
            reached = dict(zip(made, pool.map(lambda cid: _probe(rt, cid), made.values()), strict=True))
        for case, cid in made.items():
            out["children"][case] = {"id": cid, "egress": rt.child(cid).egress, "reached": reached[case]}
    finally:
        if made:
            rt.kill(list(made.values()))
        if server is not None:
            server.should_exit = True
        subprocess.run(["ip", "netns", "del", outside], capture_output=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
    return out


# -- the tests ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab_results(rt, home, base):
    from tests.conftest import BASE_TAG
    from tests.test_isolation import NET_TAG, net_snapshot

    net_snapshot(rt)
    return run_lab("tests.security.test_egress_per_sandbox", [NET_TAG, BASE_TAG], home, timeout=1800)


def reached(results: dict, case: str) -> set[str]:
    return {k for k, v in results["children"][case]["reached"].items() if v.startswith("ok:")}


def test_sdk_default_reaches_nothing(lab_results):
    assert lab_results["children"]["default"]["egress"] == "none"
    assert reached(lab_results, "default") == set(), lab_results["children"]["default"]


def test_sdk_allow_list_reaches_exactly_what_it_names(lab_results):
    c = lab_results["children"]["allow"]
    assert c["egress"] == {"allow": [f"{PRIVATE}/32:{PORT}"]}
    assert c["reached"]["private"] == f"ok:outside@{PRIVATE}", c
    assert reached(lab_results, "allow") == {"private"}, c  # not its other port, not public, not the host


def test_e2b_allow_internet_access_is_public_addresses_only(lab_results):
    c = lab_results["children"]["e2b_internet"]
    assert c["egress"] == "internet" and reached(lab_results, "e2b_internet") == {"public"}, c


def test_a_fork_keeps_its_sources_egress_unless_told(lab_results):
    assert lab_results["children"]["allow_forked"]["egress"] == {"allow": [f"{PRIVATE}/32:{PORT}"]}
    assert reached(lab_results, "allow_forked") == {"private"}, lab_results["children"]["allow_forked"]
    assert lab_results["children"]["cli_forked_none"]["egress"] == "none"
    assert reached(lab_results, "cli_forked_none") == set(), lab_results["children"]["cli_forked_none"]


def test_cli_fork_egress(lab_results):
    c = lab_results["children"]["cli"]
    assert c["egress"] == {"allow": [f"{PRIVATE}/32:{OTHER_PORT}"]}
    assert reached(lab_results, "cli") == {"private_other_port"}, c
    bad = lab_results["cli_bad"]
    assert bad["rc"] == 2 and "stands alone" in bad["stderr"], bad


def test_mcp_spawn_egress(lab_results):
    c = lab_results["children"]["mcp"]
    assert c["egress"] == "internet" and reached(lab_results, "mcp") == {"public"}, c


def test_egress_refusals_name_the_field_and_say_why(lab_results):
    r = lab_results["refused"]
    assert r["no_nic"].startswith("InvalidInput") and "without a network device" in r["no_nic"], r
    assert r["ipv6"].startswith("InvalidInput") and "IPv6 is always denied" in r["ipv6"], r
    assert r["not_a_policy"].startswith("InvalidInput") and "egress" in r["not_a_policy"], r
    assert r["pool_and_egress"].startswith("ValueError") and "pool's egress" in r["pool_and_egress"], r


if __name__ == "__main__":  # the lab, inside `unshare --net`
    lab_main(lab)
