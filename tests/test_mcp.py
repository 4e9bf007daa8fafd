"""`forkd-mcp` over stdio, driven by the official mcp client library, against a real daemon on the fake VMM driver
(tests/fake_vmm.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import BASE_TAG, WARM_GLOBAL
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon

TOOLS = {"spawn_sandboxes", "claim", "exec_command", "eval_code", "branch_sandbox", "kill_sandbox", "list_sandboxes",
         "list_snapshots", "snapshot_info", "ping_sandbox", "get_sandbox", "read_file", "write_file", "list_files",
         "read_output", "fork_sandbox", "set_timeout"}


@pytest.fixture(scope="module")
def daemon(home, fake_base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("mcp"))
    yield d
    stop_api_daemon(d)


def _is_error(res) -> bool:
    return bool(getattr(res, "is_error", None) or getattr(res, "isError", None))  # mcp 2.x / 1.x names


def _data(res):
    assert not _is_error(res), res.content
    structured = getattr(res, "structured_content", None) or getattr(res, "structuredContent", None)
    if structured is not None:
        return structured
    return json.loads(res.content[0].text)


def test_mcp_tools_over_stdio(daemon):
    params = StdioServerParameters(command=sys.executable, args=["-m", "forkd.mcp.server"],
                                   env={"FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token,
                                        "PATH": os.environ.get("PATH", ""),
                                        "PYTHONPATH": os.environ.get("PYTHONPATH", "")})  # this tree's packages

    async def go():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            assert TOOLS <= {t.name for t in (await s.list_tools()).tools}
            snaps = _data(await s.call_tool("list_snapshots", {}))["snapshots"]
            assert BASE_TAG in [x["tag"] for x in snaps]
            assert _data(await s.call_tool("snapshot_info", {"tag": BASE_TAG}))["depth"] == 0
            [sb] = _data(await s.call_tool("spawn_sandboxes", {"snapshot_tag": BASE_TAG, "n": 1}))["sandboxes"]
            try:
                res = _data(await s.call_tool("exec_command", {"sandbox_id": sb["id"], "args": ["echo", "mcp"]}))
                assert res["stdout"] == "mcp\n" and res["exit_code"] == 0
                res = _data(await s.call_tool("eval_code", {"sandbox_id": sb["id"], "code": "WARM_GLOBAL"}))
                assert res["result"] == repr(WARM_GLOBAL)
                assert _data(await s.call_tool("ping_sandbox", {"sandbox_id": sb["id"]}))["pong"] is True
                listed = _data(await s.call_tool("list_sandboxes", {}))["sandboxes"]
                assert sb["id"] in [x["id"] for x in listed]
                await _files_output_fork_timeout(s, sb["id"])
                bad = await s.call_tool("get_sandbox", {"sandbox_id": "cnope"})
                assert _is_error(bad) and "404" in bad.content[0].text
                bad = await s.call_tool("claim", {"pool": "no-such-pool"})
                assert _is_error(bad)
            finally:
                res = _data(await s.call_tool("kill_sandbox", {"sandbox_id": sb["id"]}))
            assert res == {"killed": sb["id"]}
    asyncio.run(go())


async def _files_output_fork_timeout(s, sid: str) -> None:
    """Files (write, read back, list; bytes as base64), paged output, set_timeout, fork_sandbox(n)."""
    w = _data(await s.call_tool("write_file", {"sandbox_id": sid, "path": "/tmp/mcp/a.txt", "content": "héllo"}))
    assert w["bytes"] == len("héllo".encode())
    assert _data(await s.call_tool("read_file", {"sandbox_id": sid, "path": "/tmp/mcp/a.txt"}))["content"] == "héllo"
    await s.call_tool("write_file", {"sandbox_id": sid, "path": "/tmp/mcp/b.bin", "content": "/w==",
                                     "encoding": "base64"})
    b = _data(await s.call_tool("read_file", {"sandbox_id": sid, "path": "/tmp/mcp/b.bin"}))
    assert (b["encoding"], b["content"]) == ("base64", "/w==")
    names = [e["name"] for e in _data(await s.call_tool("list_files", {"sandbox_id": sid, "path": "/tmp/mcp"}))
             ["entries"]]
    assert sorted(names) == ["a.txt", "b.bin"]
    res = _data(await s.call_tool("exec_command", {"sandbox_id": sid, "args": ["sh", "-c", "seq 1 3000"],
                                                   "max_bytes": 1000}))
    text, nxt = res["stdout"], res["stdout_next_offset"]
    while nxt is not None:
        pg = _data(await s.call_tool("read_output", {"output_id": res["output_id"], "offset": nxt,
                                                     "max_bytes": 4000}))
        text, nxt = text + pg["data"], pg["next_offset"]
    assert text.split() == [str(i) for i in range(1, 3001)]
    before = _data(await s.call_tool("get_sandbox", {"sandbox_id": sid}))["expires_at_unix"]
    after = _data(await s.call_tool("set_timeout", {"sandbox_id": sid, "timeout_secs": 3600}))["expires_at_unix"]
    assert after and (before is None or after > before)
    forks = _data(await s.call_tool("fork_sandbox", {"sandbox_id": sid, "n": 2}))["sandboxes"]
    try:
        assert len(forks) == 2
        got = _data(await s.call_tool("read_file", {"sandbox_id": forks[0]["id"], "path": "/tmp/mcp/a.txt"}))
        assert got["content"] == "héllo"  # the fork continues from the source's state
    finally:
        for f in forks:
            await s.call_tool("kill_sandbox", {"sandbox_id": f["id"]})
