"""Processes in a child through the service (`LocalProcesses`, on the node's Runtime: what the daemon's process
routes and in-process callers use; a daemon's clients use the light client's RemoteProcesses, re-exported with
this by forkd.client.processes): start (argv or shell, env, cwd, user, stdin pipe or PTY), stream the output as it
comes (`events`, with the fallback for children of older snapshots), send stdin, resize, signal, wait, list, kill.

A stream is a sequence of events (dicts), the same in both and on the wire (one JSON object per line,
`application/x-ndjson`; `data` is base64 there and bytes here):

    {"type": "start", "pid": N}
    {"type": "stdout" | "stderr", "data": ...}          as the process writes (a PTY's output is "stdout")
    {"type": "keepalive"}                               every `KEEPALIVE` seconds of silence
    {"type": "exit", "exit_code": N, "truncated": B, "timed_out": B}
    {"type": "error", "title": ..., "detail": ..., "hint": ...}   the stream broke (e.g. the child died)

A command that cannot be started streams `start` (pid null), one `stderr` line saying why, and `exit` with
126 (cannot run) or 127 (not found), as a shell would. Output beyond `max_output` bytes per stream is read
from the guest but not passed on (`truncated: true`). A signal-killed process exits with -N.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from forkd_client.processes import (  # the wire's events, shared with the light client (one encoding, one reader)
    KEEPALIVE,
    MAX_OUTPUT,
    Event,
    _start_args,
    from_line,
    to_line,
)

__all__ = ["KEEPALIVE", "MAX_OUTPUT", "Event", "LocalProcesses", "events", "from_line", "to_line"]


def events(rt: Any, child: str, start: dict | None = None, pid: int | None = None,
           max_output: int = MAX_OUTPUT, timeout: float | None = None) -> Iterator[Event]:
    """Start a process (`start`: AgentClient.start's arguments) or attach to `pid`, and yield its events. The
    first event (`start`) is yielded before any output is waited for; errors before it are raised."""
    from forkd.vmm.agent_replies import AgentError

    with rt.agent(child) as a:
        if start is not None:
            try:
                pid = a.start(**start)
            except AgentError as exc:
                code = exc.error.get("exit_code")
                if _older_agent(exc):  # a child of a snapshot made before proc_* existed: its blocking exec
                    yield from _blocking(a, start, max_output, timeout)
                    return
                if code not in (126, 127):
                    raise
                yield {"type": "start", "pid": None}
                yield {"type": "stderr", "data": f"forkd: {exc.error.get('message')}\n".encode()}
                yield {"type": "exit", "exit_code": code, "truncated": False, "timed_out": False}
                return
        yield {"type": "start", "pid": pid}
        yield from _output(a, pid, max_output, timeout)


def _older_agent(exc: Any) -> bool:
    """The agent of a snapshot older than the proc_* ops answers them with 'unknown op'."""
    return exc.error.get("type") == "RequestError" and "unknown op 'proc_start'" in str(exc.error.get("message"))


def _blocking(a: Any, start: dict, max_output: int, timeout: float | None) -> Iterator[Event]:
    """The whole command through the agent's one-shot `exec` (children of older snapshots): its output arrives at
    the end, capped by the agent; no stdin pipe, PTY or user switch there."""
    from forkd.base.errors import InvalidInput

    if start.get("pty") or start.get("stdin") or start.get("user"):
        raise InvalidInput("this child's agent predates streaming processes: no -i, -t or -u for it",
                           hint="run it without them, or fork from a snapshot rebuilt by this forkd")
    argv = start.get("argv") or ["/bin/sh", "-c", start["cmd"]]
    res = a.exec(argv, env=start.get("env"), cwd=start.get("cwd"), timeout=timeout)
    yield {"type": "start", "pid": None}
    for stream in ("stdout", "stderr"):
        data = str(res.get(stream) or "").encode()
        if data:
            yield {"type": stream, "data": data[:max_output]}
    yield {"type": "exit", "exit_code": res.get("exit_code"), "timed_out": bool(res.get("timed_out")),
           "truncated": bool(res.get("truncated")) or any(len(str(res.get(k) or "")) > max_output
                                                           for k in ("stdout", "stderr"))}


def _output(a: Any, pid: int, max_output: int, timeout: float | None) -> Iterator[Event]:
    sent = {"stdout": 0, "stderr": 0}
    truncated = timed_out = False
    deadline = time.monotonic() + timeout if timeout else None
    after = 0
    while True:
        wait = KEEPALIVE if deadline is None else max(0.0, min(KEEPALIVE, deadline - time.monotonic()))
        out = a.read_output(pid, after, wait)
        after = out.seq
        for stream, data in out.chunks:
            room = max_output - sent[stream]
            if len(data) > room:
                data, truncated = data[:max(room, 0)], True
            if data:
                sent[stream] += len(data)
                yield {"type": stream, "data": data}
        if out.done:
            yield {"type": "exit", "exit_code": out.exit_code, "truncated": truncated, "timed_out": timed_out}
            return
        if deadline is not None and time.monotonic() >= deadline and not timed_out:
            timed_out = True
            a.kill_process(pid)
        elif not out.chunks:
            yield {"type": "keepalive"}


class LocalProcesses:
    """On the caller's own Runtime (the CLI without a daemon, and the daemon's routes through the service)."""

    def __init__(self, rt: Any):
        self.rt = rt

    def stream(self, child: str, argv: list[str] | None = None, *, cmd: str | None = None, env: dict | None = None,
               cwd: str | None = None, user: str | None = None, stdin: bool = False, pty: dict | None = None,
               tag: str | None = None, max_output: int = MAX_OUTPUT, timeout: float | None = None) -> Iterator[Event]:
        return events(self.rt, child, _start_args(argv, cmd, env, cwd, user, stdin, pty, tag),
                      max_output=max_output, timeout=timeout)

    def events(self, child: str, start: dict, max_output: int = MAX_OUTPUT,
               timeout: float | None = None) -> Iterator[Event]:
        """A process started from `start` (the wire's start arguments), its events as they come."""
        return events(self.rt, child, start, max_output=max_output, timeout=timeout)

    def attach(self, child: str, pid: int, max_output: int = MAX_OUTPUT) -> Iterator[Event]:
        return events(self.rt, child, pid=pid, max_output=max_output)

    def start(self, child: str, argv: list[str] | None = None, **kw: Any) -> int:
        with self.rt.agent(child) as a:
            return a.start(argv, **kw)

    def send_stdin(self, child: str, pid: int, data: bytes, eof: bool = False) -> int:
        with self.rt.agent(child) as a:
            return a.send_stdin(pid, data, eof)

    def resize(self, child: str, pid: int, rows: int, cols: int) -> None:
        with self.rt.agent(child) as a:
            a.resize(pid, rows, cols)

    def signal(self, child: str, pid: int, sig: int | str = "SIGTERM") -> bool:
        with self.rt.agent(child) as a:
            return a.signal(pid, sig)

    def kill(self, child: str, pid: int) -> bool:
        with self.rt.agent(child) as a:
            return a.kill_process(pid)

    def wait(self, child: str, pid: int, timeout: float = 60.0) -> dict:
        with self.rt.agent(child) as a:
            return a.wait(pid, timeout)

    def list(self, child: str) -> list[dict]:
        with self.rt.agent(child) as a:
            return a.processes()

    def logs(self, child: str, offset: int = 0) -> dict:
        """The child's console log from byte `offset` (its last CONSOLE_RING bytes are kept: an offset past the
        end, after the log was cut, starts again from its beginning); the ring inside the VMM is drained first."""
        end, data = self.rt.console(child, offset)
        return {"offset": end, "data": data}
