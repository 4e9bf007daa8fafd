"""`forkd-mcp`: MCP server over stdio, built on the official `mcp` package, that drives a forkd daemon through
its REST API (forkd.sdk.AsyncController, i.e. forkd_client's AsyncClient: FORKD_URL + FORKD_TOKEN, or the local
unix socket).

Every tool says what it touches (annotations: read-only, destructive, idempotent) and what it answers (an output
schema: forkd.mcp.shapes, which leaves host paths out). Arguments of the wrong shape come back as one line naming
the argument and the type it takes; daemon errors as tool errors carrying the daemon's detail and hint.
"""

from __future__ import annotations

import base64
import functools
from typing import Any, Literal

from mcp.types import ToolAnnotations
from pydantic import ValidationError

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer
    from mcp.server.fastmcp.exceptions import ToolError

from forkd import __version__
from forkd.mcp import shapes as S
from forkd.mcp.pages import MAX_PAGE, PAGE, Outputs, page
from forkd.sdk import AsyncController, ControllerError

INSTRUCTIONS = """forkd runs Python microVM sandboxes forked copy-on-write from warm snapshots.
Spawn children of a ready snapshot (list_snapshots) or claim warm ones from a pool, run commands (exec_command;
long output: read_output) or Python in the warm interpreter (eval_code), read, write and list files, fork a
running sandbox into n copies (fork_sandbox), keep one alive (set_timeout), reach a server in it (open_port),
snapshot it (branch_sandbox), and kill sandboxes when done."""
MAX_FILE = 1024 * 1024  # read_file/write_file: larger content goes through exec_command or the SDK's streams

READ = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)
CREATE = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False, openWorldHint=False)
SETTING = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)
DESTRUCTIVE = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=False)
REMOVING = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False)
# what runs inside a sandbox may reach what its egress allows
RUNNING = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=True)

_ctrl: AsyncController | None = None
_outputs = Outputs()


def controller() -> AsyncController:
    global _ctrl
    if _ctrl is None:
        _ctrl = AsyncController()
    return _ctrl


_TYPES = {"list_type": "a list", "string_type": "a string", "int_type": "an integer", "int_parsing": "an integer",
          "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
          "bool_parsing": "true or false", "dict_type": "an object", "literal_error": "one of the listed values",
          "int_from_float": "an integer", "greater_than_equal": "larger", "less_than_equal": "smaller"}
_JSON = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean", "list": "a list",
         "dict": "an object", "NoneType": "null"}


def input_error(tool: str, exc: ValidationError) -> str:
    """One line per bad argument: its name, what it takes, what it got (never pydantic's own text or links)."""
    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"] if p != "arguments") or "arguments"
        if e["type"] == "missing":
            parts.append(f"{where} is required")
            continue
        want = _TYPES.get(e["type"]) or e["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
        got = _JSON.get(type(e.get("input")).__name__, type(e.get("input")).__name__)
        parts.append(f"{where} must be {want} (got {got})")
    return f"invalid arguments to {tool}: " + "; ".join(parts) + " (see the tool's input schema)"


class Server(MCPServer):
    """The official server, with argument errors in one clean line (input_error)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().call_tool(name, arguments, *args, **kwargs)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(input_error(name, exc.__cause__)) from exc.__cause__
            raise


def _guard(fn):
    """Daemon errors become ToolErrors, whose message (HTTP status, detail, hint) the client sees."""
    @functools.wraps(fn)
    async def run(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except ControllerError as exc:  # forkd_client.errors.ForkdError (= forkd.base.errors.ForkdError)
            where = f"HTTP {exc.status}: " if exc.status else ""
            raise ToolError(f"{type(exc).__name__}: {where}{exc}") from exc
    return run


def _sandboxes(infos: list) -> S.Sandboxes:
    return S.Sandboxes(sandboxes=[S.Sandbox.of(i) for i in infos])


def _url(path: str) -> str:
    ep = controller().endpoint
    return path if ep.socket else ep.base_url.rstrip("/") + path


def _port(grant: Any) -> S.Port:
    return S.Port(sandbox_id=grant.sandbox_id, port=grant.port, url=_url(grant.path), grant_id=grant.id)


def build() -> MCPServer:
    server = Server("forkd", instructions=INSTRUCTIONS)

    def tool(annotations: ToolAnnotations):
        return lambda fn: server.tool(annotations=annotations, structured_output=True)(_guard(fn))

    _snapshot_tools(tool)
    _sandbox_tools(tool)
    _command_tools(tool)
    _file_tools(tool)
    _port_tools(tool)
    return server


def _snapshot_tools(tool) -> None:
    @tool(READ)
    async def list_snapshots() -> S.Snapshots:
        """List snapshots (tag, status writing|ready|failed, parent_tag, sizes)."""
        return S.Snapshots(snapshots=[S.Snapshot.of(s) for s in await controller().list_snapshots()])

    @tool(READ)
    async def snapshot_info(tag: str) -> S.SnapshotDetail:
        """One snapshot in detail: chain depth, ancestors, dependents, children, bytes stored."""
        return S.SnapshotDetail.of(await controller().snapshot_info(tag))

    @tool(CREATE)
    async def branch_sandbox(sandbox_id: str, tag: str | None = None,
                             mode: Literal["live", "full", "diff"] = "live", wait: bool = True) -> S.Branched:
        """Snapshot a running sandbox as a new forkable tag (mode live|full|diff). The source keeps running."""
        return S.Branched.of(await controller().branch_sandbox(sandbox_id, tag, mode, wait))


def _sandbox_tools(tool) -> None:
    @tool(CREATE)
    async def spawn_sandboxes(snapshot_tag: str, n: int = 1, egress: S.Egress = "none",
                              timeout_secs: float | None = None) -> S.Sandboxes:
        """Fork n (1..1000) sandboxes from a ready snapshot; returns them once every one answers. egress: what
        each may reach on the network: "none" (the default), "internet" (public IPv4 only), or {"allow":
        ["CIDR:port", ...]} (exactly those); needs a snapshot built with network isolated. timeout_secs: how
        long they live (default: the daemon's; extend with set_timeout)."""
        return _sandboxes(await controller().spawn_sandboxes(snapshot_tag, n, egress=egress,
                                                             lifetime_secs=timeout_secs))

    @tool(CREATE)
    async def fork_sandbox(sandbox_id: str, n: int = 1, egress: S.Egress | None = None,
                           timeout_secs: float | None = None) -> S.Sandboxes:
        """n new sandboxes continuing from this instant of a running one (its memory, files and processes); the
        source keeps running. egress: as spawn_sandboxes; null keeps the source's."""
        return _sandboxes(await controller().fork_sandbox(sandbox_id, n, egress=egress, lifetime_secs=timeout_secs))

    @tool(CREATE)
    async def claim(pool: str, n: int = 1) -> S.Sandboxes:
        """Take n warm sandboxes from a pool at once (the pool refills in the background; its egress applies)."""
        return _sandboxes(await controller().claim(pool, n))

    @tool(READ)
    async def list_sandboxes() -> S.Sandboxes:
        """List sandboxes (id, snapshot_tag, status, egress, pool, claimed, expires_at_unix)."""
        return _sandboxes(await controller().list_sandboxes())

    @tool(READ)
    async def get_sandbox(sandbox_id: str) -> S.Sandbox:
        """One sandbox's metadata, with its egress and when it expires."""
        return S.Sandbox.of(await controller().get_sandbox(sandbox_id))

    @tool(SETTING)
    async def set_timeout(sandbox_id: str, timeout_secs: float) -> S.Sandbox:
        """Keepalive: the sandbox now expires timeout_secs from now (the daemon kills it then)."""
        return S.Sandbox.of(await controller().set_sandbox_timeout(sandbox_id, timeout_secs))

    @tool(READ)
    async def ping_sandbox(sandbox_id: str) -> S.Pong:
        """Check that a sandbox's guest agent answers."""
        return S.Pong.of(await controller().ping_sandbox(sandbox_id))

    @tool(REMOVING)
    async def kill_sandbox(sandbox_id: str) -> S.Killed:
        """Stop a sandbox and remove it (its files and processes are gone)."""
        await controller().kill_sandbox(sandbox_id)
        return S.Killed(killed=sandbox_id)


def _executed(res: Any, max_bytes: int) -> S.Executed:
    out, err = res.stdout.encode(), res.stderr.encode()
    (o_text, o_next), (e_text, e_next) = page(out, 0, max_bytes), page(err, 0, max_bytes)
    oid = _outputs.put(out, err) if o_next is not None or e_next is not None else None
    return S.Executed(exit_code=res.exit_code, timed_out=res.timed_out, truncated=res.truncated, stdout=o_text,
                      stderr=e_text, stdout_bytes=len(out), stderr_bytes=len(err), stdout_next_offset=o_next,
                      stderr_next_offset=e_next, output_id=oid)


def _command_tools(tool) -> None:
    @tool(RUNNING)
    async def exec_command(sandbox_id: str, args: list[str], timeout_secs: float = 30, cwd: str | None = None,
                           env: dict[str, str] | None = None, max_bytes: int = PAGE) -> S.Executed:
        """Run a command in a sandbox (args[0] is the program; use ["sh", "-c", "..."] for a shell line).
        Returns exit_code and the first max_bytes of stdout and stderr; when there is more, output_id and
        stdout_next_offset / stderr_next_offset: pass them to read_output for the next page."""
        if not 1 <= max_bytes <= MAX_PAGE:
            raise ToolError(f"max_bytes must be 1..{MAX_PAGE}")
        return _executed(await controller().exec_command(sandbox_id, args, timeout_secs, cwd=cwd, env=env), max_bytes)

    @tool(READ)
    async def read_output(output_id: str, stream: Literal["stdout", "stderr"] = "stdout", offset: int = 0,
                          max_bytes: int = PAGE) -> S.OutputPage:
        """The next page of a command's output (exec_command's output_id, and its *_next_offset as offset).
        The last outputs are kept only for a while: read them soon."""
        data = _outputs.get(output_id, stream)
        if data is None:
            raise ToolError(f"no output {output_id!r} here (only the last ones are kept): run the command again")
        if not 0 <= offset <= len(data) or not 1 <= max_bytes <= MAX_PAGE:
            raise ToolError(f"offset must be 0..{len(data)} and max_bytes 1..{MAX_PAGE}")
        text, nxt = page(data, offset, max_bytes)
        return S.OutputPage(output_id=output_id, stream=stream, offset=offset, data=text, next_offset=nxt,
                            total_bytes=len(data))

    @tool(RUNNING)
    async def eval_code(sandbox_id: str, code: str, mode: Literal["eval", "exec"] = "eval") -> S.Evaluated:
        """Evaluate a Python expression (mode "eval": result is its repr) or run statements (mode "exec") in the
        sandbox's warm interpreter; state persists between calls."""
        return S.Evaluated.of(await controller().eval_code(sandbox_id, code, mode=mode))


def _file_tools(tool) -> None:
    from forkd_client.files_wire import EntryInfo, EntryList
    from forkd_client.http import Call, quote

    @tool(READ)
    async def read_file(sandbox_id: str, path: str) -> S.FileContent:
        """A file's content (UTF-8 text as is, anything else base64; encoding says which), up to 1 MiB: for a
        larger one read a part with exec_command (head, tail, dd)."""
        stat = await controller()._send(Call("GET", f"/v1/sandboxes/{quote(sandbox_id)}/files/stat",
                                             params={"path": path}, parse=EntryInfo.model_validate))
        if stat.size > MAX_FILE:
            raise ToolError(f"{path} is {stat.size} bytes, over read_file's {MAX_FILE}: read a part with "
                            "exec_command (head -c, tail -c, dd)")
        data = await controller().read_file(sandbox_id, path)
        try:
            return S.FileContent(path=path, encoding="utf-8", content=data.decode("utf-8"), bytes=len(data))
        except UnicodeDecodeError:
            return S.FileContent(path=path, encoding="base64", content=base64.b64encode(data).decode(),
                                 bytes=len(data))

    @tool(DESTRUCTIVE)
    async def write_file(sandbox_id: str, path: str, content: str, encoding: Literal["utf-8", "base64"] = "utf-8",
                         mode: int = 0o644) -> S.FileWritten:
        """Create or replace a file (its parent directories are made), up to 1 MiB; encoding "base64" for
        bytes that are not text. mode: permission bits (decimal, e.g. 493 for 0755)."""
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        except ValueError:
            raise ToolError("content is not valid base64 (encoding is \"base64\")") from None
        if len(data) > MAX_FILE:
            raise ToolError(f"content is {len(data)} bytes, over write_file's {MAX_FILE}")
        return S.FileWritten.of(await controller().write_file(sandbox_id, path, data, mode=mode))

    @tool(READ)
    async def list_files(sandbox_id: str, path: str = "/", depth: int = 1, cursor: str | None = None,
                         limit: int = 200) -> S.Entries:
        """One page of the entries under a directory, depth levels down (symlinks are not followed); pass
        next_cursor back as cursor for the next page."""
        params: dict[str, Any] = {"path": path, "depth": depth, "limit": limit}
        if cursor:
            params["cursor"] = cursor
        res = await controller()._send(Call("GET", f"/v1/sandboxes/{quote(sandbox_id)}/files/list", params=params,
                                            parse=EntryList.model_validate))
        return S.Entries(entries=[S.Entry.of(e) for e in res.entries], next_cursor=res.next_cursor)


def _port_tools(tool) -> None:
    @tool(CREATE)
    async def open_port(sandbox_id: str, port: int) -> S.Port:
        """A URL through the daemon to a TCP port a server in the sandbox listens on (HTTP and WebSocket), for
        whoever holds it, until close_port or the sandbox dies. Any sandbox, with a network device or not. Keep
        the URL: its token is shown this once (each call opens a new one)."""
        return _port(await controller().open_port(sandbox_id, port))

    @tool(READ)
    async def list_ports(sandbox_id: str) -> S.Ports:
        """The port grants of a sandbox opened with open_port: ports and grant ids; the URLs with the placeholder
        {token}, since a token is shown only by the open_port that made it."""
        return S.Ports(ports=[S.PortInfo(sandbox_id=g.sandbox_id, port=g.port, grant_id=g.id, url=_url(g.path))
                              for g in await controller().list_ports(sandbox_id)])

    @tool(REMOVING)
    async def close_port(sandbox_id: str, port: int | None = None, grant_id: str | None = None) -> S.PortClosed:
        """Revoke opened URLs: every one of `port`, or the one with `grant_id` (give one of the two); they stop
        working."""
        if (port is None) == (grant_id is None):
            raise ToolError("close_port takes port or grant_id (one of the two)")
        await controller().close_port(sandbox_id, port if grant_id is None else grant_id)
        return S.PortClosed(sandbox_id=sandbox_id, port=port, grant_id=grant_id, closed=True)


def main() -> None:
    import sys

    if "--version" in sys.argv[1:]:
        print(__version__)
        return
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # stderr stays for real problems
    build().run("stdio")


if __name__ == "__main__":
    main()
