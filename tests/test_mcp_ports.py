"""MCP against a real daemon on the fake VMM driver (tests/fake_vmm.py), through the official `mcp` client over
stdio: forkd-mcp's port tools (the URL it gives reaches a server in the sandbox, relayed by its agent, and stops
at close_port), and upstream's published `forkd-mcp` (deeplethe/forkd's Python package) on the tools it shares.

Upstream's package needs mcp<2, which this tree's environment does not have: it runs from its own environment,
named by FORKD_UPSTREAM_MCP (the path of its `forkd-mcp` script; docs/testing.md says how to make one). Without
it, that test is skipped and says why.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon


@pytest.fixture(scope="module")
def daemon(home, fake_base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("mcp-ports"))
    yield d
    stop_api_daemon(d)


def _session(command: list[str], daemon, fn):
    env = {"FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token, "PATH": os.environ.get("PATH", "")}
    if command[0] == sys.executable:
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # this tree's packages
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)

    async def go():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return await fn(s)
    return asyncio.run(go())


def _data(res):
    assert not (getattr(res, "is_error", None) or getattr(res, "isError", None)), res.content
    structured = getattr(res, "structured_content", None) or getattr(res, "structuredContent", None)
    if structured is not None:
        return structured.get("result", structured) if set(structured) == {"result"} else structured
    return json.loads(res.content[0].text)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve_in(netns_name: str) -> http.server.HTTPServer:
    """An HTTP server on the loopback of the fake child's namespace, where its agent runs (the fake guest's own
    server would be the same process tree: this one stands for it)."""
    from forkd.sandbox import netns

    subprocess.run(["ip", "-n", netns_name, "link", "set", "lo", "up"], check=True)
    with netns.inside(netns_name):
        srv = http.server.HTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_mcp_port_tools_reach_a_server_through_the_daemon(daemon, rt):
    ours = [sys.executable, "-m", "forkd.mcp.server"]

    async def spawn(s):
        return _data(await s.call_tool("spawn_sandboxes", {"snapshot_tag": BASE_TAG, "n": 1}))

    (sb,) = _session(ours, daemon, spawn)["sandboxes"]
    srv = _serve_in(rt.child(sb["id"]).netns)
    try:
        async def ports(s):
            opened = _data(await s.call_tool("open_port", {"sandbox_id": sb["id"], "port": srv.server_port}))
            listed = _data(await s.call_tool("list_ports", {"sandbox_id": sb["id"]}))
            return opened, listed

        opened, listed = _session(ours, daemon, ports)
        url = opened["url"]
        assert url.startswith(daemon.url + f"/v1/ports/{sb['id']}/{srv.server_port}/")
        assert [(p["port"], p["grant_id"]) for p in listed["ports"]] == [(srv.server_port, opened["grant_id"])]
        token = url.rstrip("/").rsplit("/", 1)[1]
        assert listed["ports"][0]["url"].endswith("/{token}/") and token not in json.dumps(listed)  # shown once
        assert httpx.get(url + "x?y=1", timeout=60).text == "hello /x?y=1"  # no bearer: the URL's token
        assert httpx.get(url.replace(f"/{srv.server_port}/", "/1/") + "x", timeout=60).status_code == 404

        async def close(s):
            neither = await s.call_tool("close_port", {"sandbox_id": sb["id"]})
            return neither, _data(await s.call_tool("close_port", {"sandbox_id": sb["id"],
                                                                   "grant_id": opened["grant_id"]}))

        neither, closed = _session(ours, daemon, close)
        assert neither.is_error and "port or grant_id" in neither.content[0].text, neither
        assert closed["closed"] is True
        assert httpx.get(url + "x", timeout=60).status_code == 404
    finally:
        srv.shutdown()
        rt.kill([sb["id"]])


def _upstream() -> list[str]:
    path = os.environ.get("FORKD_UPSTREAM_MCP", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("FORKD_UPSTREAM_MCP does not name upstream's forkd-mcp script (docs/testing.md: a venv with "
                    "'mcp<2' and forkd-mcp==0.2.1)")
    return [path]


def test_upstreams_forkd_mcp_drives_this_daemon(daemon, rt):
    """The calls upstream's forkd-mcp 0.2.1 makes, as it makes them (its own request bodies: prewarm,
    memory_limit_mib, per_child_netns; exec's args and timeout_secs; eval's bare code)."""
    upstream = _upstream()

    async def go(s):
        names = {t.name for t in (await s.list_tools()).tools}
        snaps = _data(await s.call_tool("list_snapshots", {}))
        spawned = _data(await s.call_tool("spawn_sandboxes", {"snapshot_tag": BASE_TAG, "n": 1}))
        sid = spawned[0]["id"]
        got = _data(await s.call_tool("get_sandbox", {"sandbox_id": sid}))
        listed = _data(await s.call_tool("list_sandboxes", {}))
        ran = _data(await s.call_tool("exec_command", {"sandbox_id": sid,
                                                       "args": ["python3", "-c", "print(2 + 2)"]}))
        evaluated = _data(await s.call_tool("eval_code", {"sandbox_id": sid, "code": "6 * 7"}))
        pinged = _data(await s.call_tool("ping_sandbox", {"sandbox_id": sid}))
        await s.call_tool("exec_command", {"sandbox_id": sid, "args": ["sh", "-c", "echo READY > /tmp/mark"]})
        waited = _data(await s.call_tool("wait_for_text", {"sandbox_id": sid, "path": "/tmp/mark",
                                                           "marker": "READY", "timeout_secs": 60}))
        killed = _data(await s.call_tool("kill_sandbox", {"sandbox_id": sid}))
        return names, snaps, sid, got, listed, ran, evaluated, pinged, waited, killed

    names, snaps, sid, got, listed, ran, evaluated, pinged, waited, killed = _session(upstream, daemon, go)
    assert {"list_snapshots", "spawn_sandboxes", "exec_command", "eval_code", "kill_sandbox"} <= names
    assert BASE_TAG in [s["tag"] for s in (snaps if isinstance(snaps, list) else [snaps])]
    assert got["id"] == sid and sid in [x["id"] for x in (listed if isinstance(listed, list) else [listed])]
    assert ran["exit_code"] == 0 and ran["stdout"] == "4\n", ran
    assert "42" in json.dumps(evaluated), evaluated
    assert pinged and waited["found"] is True, (pinged, waited)
    assert killed == {"id": sid, "killed": True}
    assert sid not in [r.id for r in rt.children() if r.status == "running"]
