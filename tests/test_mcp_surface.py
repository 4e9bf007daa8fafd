"""forkd-mcp's surface, through the official `mcp` client over stdio: every tool carries annotations and an output
schema, answers leave host paths out, and arguments of the wrong shape get one clean line. No VM: the daemon is
tests.http_stub's loopback server (the part under test is the MCP server, not the daemon)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from forkd.mcp.pages import Outputs, page
from tests.http_stub import Draining, serving

TOOLS = {"spawn_sandboxes", "claim", "exec_command", "eval_code", "branch_sandbox", "kill_sandbox", "list_sandboxes",
         "list_snapshots", "snapshot_info", "ping_sandbox", "get_sandbox", "read_file", "write_file", "list_files",
         "read_output", "fork_sandbox", "set_timeout", "open_port", "list_ports", "close_port"}
HOST_FIELDS = {"dir", "pid", "netns", "guest_addr", "agent_socket", "token"}
SNAP = {"tag": "py", "status": "ready", "dir": "/var/lib/forkd/snapshots/py", "memory_mib": 512}


class Answering(Draining):
    busy = 0


def _session(url: str, fn):
    params = StdioServerParameters(command=sys.executable, args=["-m", "forkd.mcp.server"],
                                   env={"FORKD_URL": url, "FORKD_TOKEN": "t" * 32, "PATH": os.environ.get("PATH", ""),
                                        "PYTHONPATH": os.environ.get("PYTHONPATH", "")})

    async def go():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return await fn(s)
    return asyncio.run(go())


def _properties(schema) -> set[str]:
    """Every property name anywhere in a JSON schema (its $defs too)."""
    if isinstance(schema, list):
        return set().union(*map(_properties, schema)) if schema else set()
    if not isinstance(schema, dict):
        return set()
    names = set(schema.get("properties") or {})
    return names | set().union(*map(_properties, schema.values()))


def _text(res) -> str:
    return res.content[0].text


def test_every_tool_has_annotations_and_an_output_schema_without_host_fields():
    with serving(Answering) as url:
        tools = _session(url, lambda s: s.list_tools())
    by_name = {t.name: t for t in tools.tools}
    assert TOOLS <= set(by_name)
    for t in tools.tools:
        a = t.annotations
        assert a is not None and a.read_only_hint is not None and a.destructive_hint is not None, t.name
        assert not (a.read_only_hint and a.destructive_hint), t.name
        assert t.output_schema and t.output_schema.get("type") == "object", t.name
        assert not HOST_FIELDS & _properties(t.output_schema), t.name
    assert by_name["list_files"].annotations.read_only_hint and by_name["kill_sandbox"].annotations.destructive_hint
    assert not by_name["exec_command"].annotations.read_only_hint


def test_list_snapshots_leaves_the_host_path_out():
    with serving(Answering) as url:
        Answering.answers = {"/v1/snapshots": ("application/json", json.dumps([SNAP]).encode())}
        res = _session(url, lambda s: s.call_tool("list_snapshots", {}))
    assert not res.is_error, _text(res)
    snaps = res.structured_content["snapshots"]
    assert snaps[0]["tag"] == "py" and "dir" not in snaps[0]
    assert "/var/lib/forkd" not in json.dumps(res.structured_content) + _text(res)


def test_a_string_where_a_list_is_expected_is_one_clean_line():
    async def calls(s):
        return (await s.call_tool("exec_command", {"sandbox_id": "c1", "args": "echo hi"}),
                await s.call_tool("spawn_sandboxes", {"n": "many"}))
    with serving(Answering) as url:
        bad_list, bad_n = _session(url, calls)
    assert bad_list.is_error and bad_n.is_error
    assert _text(bad_list) == ("invalid arguments to exec_command: args must be a list (got a string) (see the "
                               "tool's input schema)"), _text(bad_list)
    assert "snapshot_tag is required" in _text(bad_n) and "n must be an integer (got a string)" in _text(bad_n)
    for res in (bad_list, bad_n):
        assert "pydantic" not in _text(res) and "validation error" not in _text(res).lower()
    assert Answering.seen == {}  # refused before the daemon was asked


def test_command_output_pages_end_to_end_and_never_split_a_character():
    data = ("é" * 10 + "end").encode()  # 2-byte characters
    text, nxt, got = "", 0, []
    while nxt is not None:
        text, nxt = page(data, nxt, 5)
        got.append(text)
    assert "".join(got) == data.decode() and all("\ufffd" not in g for g in got)
    kept = Outputs(keep=2)
    first = kept.put(b"a", b"")
    kept.put(b"b", b""), kept.put(b"c", b"")
    assert kept.get(first, "stdout") is None  # the oldest is dropped: bounded
