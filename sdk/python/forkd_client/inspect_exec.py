"""One command of the Inspect provider, streamed through the daemon: stdin is sent while the output is read (a
command that echoes its input never deadlocks on full pipes), output beyond `limit` bytes per stream stops the
command (it is killed, as Inspect's own subprocess does), and the daemon kills the process group at `timeout`.
Imports no inspect_ai: the provider turns an Outcome into Inspect's results and errors."""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio

from forkd_client.errors import ForkdError
from forkd_client.processes import MAX_OUTPUT

GRACE = 30.0  # seconds past `timeout` before the client stops waiting for the daemon's own kill


@dataclass
class Outcome:
    """How a command ended: exit code (a signal N is 128 + N, as a shell reports it), output, and why it ended
    early if it did (`timed_out`, `over_limit`, `broken`: the stream's error). `pid` is None when the command
    never started (the agent could not run it: code 126, or 127 when not found; stderr says why)."""

    code: int = -1
    pid: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    over_limit: bool = False
    broken: str | None = None
    buf: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})


async def run_streamed(sb: Any, cmd: list[str], data: bytes | None, *, cwd: str | None, env: dict[str, str] | None,
                       user: str | None, timeout: float | None, limit: int) -> Outcome:
    """Run `cmd` in the AsyncSandbox `sb` with `data` as its stdin (None: no stdin)."""
    out = Outcome()
    events = sb.commands.stream(cmd, envs=env, cwd=cwd, user=user, stdin=data is not None, timeout=timeout,
                                max_output=min(limit + 1, MAX_OUTPUT))
    with anyio.move_on_after(timeout + GRACE if timeout else None) as scope:
        async with aclosing(events):
            first = await anext(events)
            out.pid = first.get("pid")
            async with anyio.create_task_group() as tg:
                if data is not None and out.pid is not None:
                    tg.start_soon(_send_stdin, sb, out.pid, data)
                await _read(sb, events, out, limit)
                if out.broken:
                    tg.cancel_scope.cancel()  # the command's fate is unknown: its stdin may block for good
    if scope.cancelled_caught:
        out.timed_out = True
        await _kill(sb, out.pid)
    out.stdout, out.stderr = bytes(out.buf["stdout"]), bytes(out.buf["stderr"])
    return out


async def _read(sb: Any, events: Any, out: Outcome, limit: int) -> None:
    async for ev in events:
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            out.buf[kind] += ev["data"]
            if len(out.buf[kind]) > limit:
                out.over_limit = True
                await _kill(sb, out.pid)
                return
        elif kind == "exit":
            code = ev.get("exit_code")
            out.code = 128 - code if isinstance(code, int) and code < 0 else code if isinstance(code, int) else -1
            out.timed_out = bool(ev.get("timed_out"))
            return
        elif kind == "error":
            out.broken = f"{ev.get('title')}: {ev.get('detail')}"
            return
    out.broken = "the daemon ended the stream without the command's exit"


async def _send_stdin(sb: Any, pid: int, data: bytes) -> None:
    """All of `data`, then end of file; a command that exits (or closes its stdin) first just does not get it.

    Once the command has ended the sender is left to finish (its next request fails at once), not cancelled:
    anyio's asyncio UNIX-socket stream raises InvalidStateError from the loop when a pending read is cancelled in
    the very iteration its socket turns readable, which a reply to that request does."""
    try:
        await sb.commands.send_stdin(pid, data, eof=True)
    except ForkdError:
        pass


async def _kill(sb: Any, pid: int | None) -> None:
    if pid is not None:
        try:
            await sb.commands.kill(pid)
        except ForkdError:
            pass
