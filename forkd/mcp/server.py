"""`forkd-mcp`: MCP server over stdio, built on the official `mcp` package, that drives a forkd daemon through
its REST API (forkd.sdk.AsyncController, i.e. forkd_client's AsyncClient: FORKD_URL + FORKD_TOKEN, or the local
unix socket).

Tools: spawn_sandboxes, claim, exec_command, eval_code, branch_sandbox, kill_sandbox, list_sandboxes,
get_sandbox, list_snapshots, snapshot_info, ping_sandbox. Results are JSON objects; daemon errors come back as
tool errors carrying the daemon's problem detail and hint.
"""

from __future__ import annotations

import functools
from typing import Any

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer
    from mcp.server.fastmcp.exceptions import ToolError

from forkd import __version__
from forkd.sdk import AsyncController, ControllerError

INSTRUCTIONS = """forkd runs Python microVM sandboxes forked copy-on-write from warm snapshots.
Spawn children of a ready snapshot (list_snapshots) or claim warm ones from a pool, run commands (exec_command)
or Python expressions in the warm interpreter (eval_code), snapshot a running sandbox (branch_sandbox) to fork
more from that exact state, and kill sandboxes when done."""

_ctrl: AsyncController | None = None


def controller() -> AsyncController:
    global _ctrl
    if _ctrl is None:
        _ctrl = AsyncController()
    return _ctrl


def _dump(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return obj.model_dump(mode="json", exclude_none=True) if hasattr(obj, "model_dump") else obj


def _guard(fn):
    """Daemon errors become ToolErrors, whose message (HTTP status, detail, hint) the client sees."""
    @functools.wraps(fn)
    async def run(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except ControllerError as exc:  # forkd_client.errors.ForkdError (= forkd.base.errors.ForkdError)
            where = f"{exc.url}: HTTP {exc.status}: " if exc.status else ""
            raise ToolError(f"{type(exc).__name__}: {where}{exc}") from exc
    return run


def build() -> MCPServer:
    server = MCPServer("forkd", instructions=INSTRUCTIONS)

    def server_tool():
        return lambda fn: server.tool()(_guard(fn))

    @server_tool()
    async def list_snapshots() -> dict:
        """List snapshots (tag, status writing|ready|failed, parent_tag, sizes)."""
        return {"snapshots": _dump(await controller().list_snapshots())}

    @server_tool()
    async def snapshot_info(tag: str) -> dict:
        """One snapshot in detail: chain depth, ancestors, dependents, children, bytes stored."""
        return _dump(await controller().snapshot_info(tag))

    @server_tool()
    async def spawn_sandboxes(snapshot_tag: str, n: int = 1, egress: str | dict[str, list[str]] = "none") -> dict:
        """Fork n (1..1000) sandboxes from a ready snapshot; returns them once every one answers. egress: what
        each may reach on the network: "none" (the default), "internet" (public IPv4 only), or {"allow":
        ["CIDR:port", ...]} (exactly those); needs a snapshot built with network isolated."""
        return {"sandboxes": _dump(await controller().spawn_sandboxes(snapshot_tag, n, egress=egress))}

    @server_tool()
    async def claim(pool: str, n: int = 1) -> dict:
        """Take n warm sandboxes from a pool at once (the pool refills in the background)."""
        return {"sandboxes": _dump(await controller().claim(pool, n))}

    @server_tool()
    async def list_sandboxes() -> dict:
        """List sandboxes (id, snapshot_tag, status, pool, claimed)."""
        return {"sandboxes": _dump(await controller().list_sandboxes())}

    @server_tool()
    async def get_sandbox(sandbox_id: str) -> dict:
        """One sandbox's metadata."""
        return _dump(await controller().get_sandbox(sandbox_id))

    @server_tool()
    async def exec_command(sandbox_id: str, args: list[str], timeout_secs: float = 30) -> dict:
        """Run a command in a sandbox (args[0] is the program; use ["sh", "-c", "..."] for a shell line).
        Returns stdout, stderr, exit_code."""
        return _dump(await controller().exec_command(sandbox_id, args, timeout_secs))

    @server_tool()
    async def eval_code(sandbox_id: str, code: str, mode: str = "eval") -> dict:
        """Evaluate a Python expression (mode "eval": result is its repr) or run statements (mode "exec") in the
        sandbox's warm interpreter; state persists between calls."""
        return _dump(await controller().eval_code(sandbox_id, code, mode=mode))

    @server_tool()
    async def branch_sandbox(sandbox_id: str, tag: str | None = None, mode: str = "live", wait: bool = True) -> dict:
        """Snapshot a running sandbox as a new forkable tag (mode live|full|diff). The source keeps running."""
        return _dump(await controller().branch_sandbox(sandbox_id, tag, mode, wait))

    @server_tool()
    async def ping_sandbox(sandbox_id: str) -> dict:
        """Check that a sandbox's guest agent answers."""
        return _dump(await controller().ping_sandbox(sandbox_id))

    @server_tool()
    async def kill_sandbox(sandbox_id: str) -> dict:
        """Stop a sandbox and remove it."""
        await controller().kill_sandbox(sandbox_id)
        return {"killed": sandbox_id}

    return server


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
