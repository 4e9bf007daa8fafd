"""Processes in a sandbox through the daemon's streaming API (/v1/sandboxes/{id}/processes): start (argv or
shell, env, cwd, user, stdin pipe or PTY), stream the output as it comes, send stdin, resize, signal, wait, list,
kill. A stream is a sequence of events, one JSON object per line (`application/x-ndjson`, `data` base64 there
and bytes here): start {pid}, stdout/stderr {data}, keepalive, exit {exit_code, truncated, timed_out}, error.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx

from forkd_client.http import Call, quote

KEEPALIVE = 20.0  # the daemon's seconds of silence before a keepalive event (also how long one agent read waits)
MAX_OUTPUT = 1 << 30  # the most bytes per stream a stream passes on (a request may ask for fewer)
Event = dict[str, Any]


def to_line(ev: Event) -> bytes:
    """One event as an NDJSON line (bytes as base64): what the daemon streams."""
    if isinstance(ev.get("data"), bytes | bytearray):
        ev = dict(ev, data=base64.b64encode(ev["data"]).decode())
    return json.dumps(ev).encode() + b"\n"


def from_line(line: bytes | str) -> Event:
    """One NDJSON line as an event (`data` decoded to bytes)."""
    ev = json.loads(line)
    if isinstance(ev, dict) and isinstance(ev.get("data"), str):
        ev["data"] = base64.b64decode(ev["data"])
    return ev


def _start_args(argv: list[str] | None, cmd: str | None, env: dict | None, cwd: str | None, user: str | None,
                stdin: bool, pty: dict | None, tag: str | None) -> dict:
    args = {"argv": argv, "cmd": cmd, "env": env, "cwd": cwd, "user": user, "stdin": stdin, "pty": pty, "tag": tag}
    return {k: v for k, v in args.items() if v is not None and v is not False}


class RemoteProcesses:
    """Through a daemon's /v1/sandboxes/{id}/processes routes; `http` is a forkd_client.http.SyncHttp."""

    def __init__(self, http: Any):
        self.http = http

    def _path(self, child: str, pid: int | None = None, tail: str = "") -> str:
        base = f"/v1/sandboxes/{quote(child)}/processes"
        return base + (f"/{pid}" if pid is not None else "") + tail

    def _lines(self, method: str, path: str, **kw: Any) -> Iterator[Event]:
        """The stream's events (opened with the client's retries: nothing is sent twice)."""
        call = Call(method, path, timeout=httpx.Timeout(60.0, read=KEEPALIVE * 3), **kw)
        with self.http.stream(call) as r:
            for line in r.iter_lines():
                if line.strip():
                    yield from_line(line)

    def stream(self, child: str, argv: list[str] | None = None, *, cmd: str | None = None, env: dict | None = None,
               cwd: str | None = None, user: str | None = None, stdin: bool = False, pty: dict | None = None,
               tag: str | None = None, max_output: int = MAX_OUTPUT, timeout: float | None = None) -> Iterator[Event]:
        body = _start_args(argv, cmd, env, cwd, user, stdin, pty, tag)
        body.update(max_output=max_output, timeout_secs=timeout)
        return self._lines("POST", self._path(child), json=body)

    def attach(self, child: str, pid: int, max_output: int = MAX_OUTPUT) -> Iterator[Event]:
        return self._lines("GET", self._path(child, pid, "/output"), params={"max_output": max_output})

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self.http._send(Call(method, path, **kw))

    def start(self, child: str, argv: list[str] | None = None, **kw: Any) -> int:
        body = _start_args(argv, kw.get("cmd"), kw.get("env"), kw.get("cwd"), kw.get("user"), kw.get("stdin", False),
                           kw.get("pty"), kw.get("tag"))
        return self._call("POST", self._path(child), json=dict(body, background=True))["pid"]

    def send_stdin(self, child: str, pid: int, data: bytes, eof: bool = False) -> int:
        view, n = memoryview(bytes(data)), len(data)
        while True:  # at most 1 MiB per request
            part, view = view[:1 << 20], view[1 << 20:]
            self._call("POST", self._path(child, pid, "/stdin"),
                       json={"data": base64.b64encode(part).decode(), "eof": eof and not view})
            if not view:
                return n

    def resize(self, child: str, pid: int, rows: int, cols: int) -> None:
        self._call("POST", self._path(child, pid, "/resize"), json={"rows": rows, "cols": cols})

    def signal(self, child: str, pid: int, sig: int | str = "SIGTERM") -> bool:
        return self._call("POST", self._path(child, pid, "/signal"), json={"signal": sig})["sent"]

    def kill(self, child: str, pid: int) -> bool:
        return self._call("DELETE", self._path(child, pid))["sent"]

    def wait(self, child: str, pid: int, timeout: float = 60.0) -> dict:
        return self._call("POST", self._path(child, pid, "/wait"), params={"timeout": timeout},
                          timeout=timeout + 30.0)

    def list(self, child: str) -> list[dict]:
        return self._call("GET", self._path(child))

    def logs(self, child: str, offset: int = 0) -> dict:
        res = self._call("GET", f"/v1/sandboxes/{quote(child)}/logs", params={"offset": offset})
        return dict(res, data=base64.b64decode(res["data"]))
