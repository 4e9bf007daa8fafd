"""`sb.commands` of an AsyncSandbox: the same as forkd_client.commands (streamed NDJSON events, callbacks with
text, results with text and exact bytes, `background=True` for a handle), as coroutines on the async client.

    res = await sb.commands.run("make", on_stdout=print)          # CommandResult
    h = await sb.commands.run("python server.py", background=True)
    await h.send_stdin("quit\\n"); print((await h.wait()).exit_code)   # non-zero: CommandExitException
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx

from forkd_client.commands import KEEP, CommandResult, OnOutput, _Collector, checked
from forkd_client.errors import Timeout
from forkd_client.http import Call, quote
from forkd_client.processes import KEEPALIVE, _start_args, from_line


async def _drain(events: AsyncIterator[dict], c: _Collector) -> CommandResult:
    try:
        async for ev in events:
            if ev["type"] in ("stdout", "stderr"):
                c.feed(ev["type"], ev["data"])
            elif ev["type"] in ("exit", "error"):
                return c.result(ev)
    except Exception as exc:  # noqa: BLE001 - reported in the result, as the sync handle does
        return c.result({"type": "error", "detail": str(exc)})
    return c.result({"type": "error"})


class AsyncCommandHandle:
    """A started command: `pid`; `await wait()` for its CommandResult; `send_stdin`, `kill`, `signal`."""

    def __init__(self, cmds: AsyncProcessCommands, pid: int | None, task: asyncio.Task, limit: float | None = None):
        self._cmds, self.pid, self._task, self._limit = cmds, pid, task, limit

    async def wait(self, timeout: float | None = None, check: bool = True) -> CommandResult:
        """As CommandHandle.wait: CommandExitException / TimeoutException unless `check=False`."""
        try:
            res = await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            raise Timeout(f"command {self.pid} in sandbox {self._cmds._sb.id} still runs after {timeout} s",
                          hint="wait longer, or kill() it") from None
        return checked(res, check, self._limit, f"command {self.pid} in sandbox {self._cmds._sb.id}")

    async def send_stdin(self, data: str | bytes, eof: bool = False) -> None:
        await self._cmds.send_stdin(self.pid, data, eof)

    async def kill(self) -> bool:
        return await self._cmds.kill(self.pid)

    async def signal(self, sig: int | str = "SIGTERM") -> bool:
        return (await self._cmds._call("POST", f"/{self.pid}/signal", json={"signal": sig}))["sent"]


class AsyncProcessCommands:
    def __init__(self, sb: Any):
        self._sb = sb

    def _path(self, tail: str = "") -> str:
        return f"/v1/sandboxes/{quote(self._sb.id)}/processes{tail}"

    async def _call(self, method: str, tail: str, **kw: Any) -> Any:
        return await self._sb.controller._send(Call(method, self._path(tail), **kw))

    async def _events(self, method: str, path: str, **kw: Any) -> AsyncIterator[dict]:
        """The stream's events (opened with the client's retries: nothing is sent twice)."""
        call = Call(method, path, timeout=httpx.Timeout(60.0, read=KEEPALIVE * 3), **kw)
        async with self._sb.controller.stream(call) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    yield from_line(line)

    async def _handle(self, events: AsyncIterator[dict], c: _Collector,
                      limit: float | None = None) -> AsyncCommandHandle:
        first = await anext(events)
        return AsyncCommandHandle(self, first.get("pid"), asyncio.create_task(_drain(events, c)), limit)

    async def run(self, cmd: str | list[str], background: bool = False, envs: dict[str, str] | None = None,
                  cwd: str | None = None, user: str | None = None, on_stdout: OnOutput | None = None,
                  on_stderr: OnOutput | None = None, timeout: float | None = 60,
                  stdin: str | bytes | bool | None = None, pty: dict | None = None,
                  max_output: int = KEEP, check: bool = True) -> CommandResult | AsyncCommandHandle:
        """As forkd_client.commands.ProcessCommands.run, awaited."""
        argv = list(cmd) if isinstance(cmd, list | tuple) else None
        env = {**self._sb.envs, **(envs or {})} or None
        body = _start_args(argv, cmd if argv is None else None, env, cwd, user,
                           stdin is not None and stdin is not False, pty, None)
        body.update(max_output=max_output, timeout_secs=timeout)
        handle = await self._handle(self._events("POST", self._path(), json=body),
                                    _Collector(on_stdout, on_stderr, max_output), limit=timeout)
        if isinstance(stdin, str | bytes) and handle.pid is not None:
            await handle.send_stdin(stdin, eof=True)
        return handle if background else await handle.wait(check=check)

    def stream(self, cmd: str | list[str], *, envs: dict[str, str] | None = None, cwd: str | None = None,
               user: str | None = None, stdin: bool = False, timeout: float | None = None,
               max_output: int = KEEP) -> AsyncIterator[dict]:
        """Start a command and yield its events as they come (forkd_client.processes: start {pid},
        stdout/stderr {data: bytes}, keepalive, exit {exit_code, truncated, timed_out}, error): for callers that
        act on output as it arrives (stop at a limit, send stdin while reading). `stdin=True` keeps a pipe open
        for send_stdin; `timeout`: the daemon kills the process group then (exit has `timed_out`)."""
        argv = list(cmd) if isinstance(cmd, list | tuple) else None
        env = {**self._sb.envs, **(envs or {})} or None
        body = _start_args(argv, cmd if argv is None else None, env, cwd, user, stdin, None, None)
        body.update(max_output=max_output, timeout_secs=timeout)
        return self._events("POST", self._path(), json=body)

    async def connect(self, pid: int, on_stdout: OnOutput | None = None, on_stderr: OnOutput | None = None,
                      max_output: int = KEEP) -> AsyncCommandHandle:
        events = self._events("GET", self._path(f"/{pid}/output"), params={"max_output": max_output})
        return await self._handle(events, _Collector(on_stdout, on_stderr, max_output))

    async def list(self) -> list[dict]:
        return await self._call("GET", "")

    async def kill(self, pid: int) -> bool:
        return (await self._call("DELETE", f"/{pid}"))["sent"]

    async def send_stdin(self, pid: int, data: str | bytes, eof: bool = False) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        view = memoryview(raw)
        while True:  # at most 1 MiB per request
            part, view = view[:1 << 20], view[1 << 20:]
            await self._call("POST", f"/{pid}/stdin", json={"data": base64.b64encode(part).decode(),
                                                            "eof": eof and not view})
            if not view:
                return
