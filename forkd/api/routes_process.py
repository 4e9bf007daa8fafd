"""Processes in a sandbox (`/v1/sandboxes/{id}/processes`): start one and stream its output as it comes, attach to
a background one, send stdin, resize its PTY, signal, wait, list, kill, through the service's processes
(forkd.service.processes).

Streams are `application/x-ndjson` (chunked; one JSON event per line, output base64 in `data`: bytes end to end);
the events are described in forkd.service.processes. Each open stream holds a worker thread of its own pool
(`STREAMS`), so many streams do not starve the other routes; the other calls into the guest run on the app's
guest pool (forkd.api.guestio), within its per-child and per-client limits."""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from forkd.api.guestio import GuestIO
from forkd.base.errors import InvalidInput
from forkd.service import Service
from forkd.service.processes import MAX_OUTPUT, to_line

STREAMS = 512  # streams open at once (each holds one worker thread while it waits for output)
NDJSON = "application/x-ndjson"
MAX_STDIN = 1 << 20  # bytes of stdin per request (base64 in JSON)
EVENTS_DOC = {
    200: {"description": "NDJSON events, one per line: start {pid}, stdout/stderr {data: base64}, keepalive, "
                         "exit {exit_code, truncated, timed_out}, error {title, detail, hint}",
          "content": {NDJSON: {"schema": {"type": "object", "required": ["type"], "properties": {
              "type": {"type": "string", "enum": ["start", "stdout", "stderr", "keepalive", "exit", "error"]},
              "pid": {"type": ["integer", "null"]}, "data": {"type": "string", "format": "byte"},
              "exit_code": {"type": "integer"}, "truncated": {"type": "boolean"},
              "timed_out": {"type": "boolean"}, "detail": {"type": "string"}}}}}},
}


class PtySize(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: int = Field(24, ge=1, le=9999)
    cols: int = Field(80, ge=1, le=9999)


class ProcessStart(BaseModel):
    """A process to start: `argv`, or `cmd` (run by /bin/sh -c)."""

    model_config = ConfigDict(extra="forbid")
    argv: list[str] | None = Field(None, min_length=1)
    cmd: str | None = Field(None, min_length=1)
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    stdin: bool = Field(False, description="keep stdin open as a pipe (else /dev/null); send it to /stdin")
    pty: PtySize | None = Field(None, description="run on a PTY of this size (its output is stdout)")
    tag: str | None = Field(None, max_length=256)
    background: bool = Field(False, description="answer {pid} at once instead of streaming; attach to /output")
    timeout_secs: float | None = Field(None, gt=0, description="kill the process after this long (streams only)")
    max_output: int = Field(MAX_OUTPUT, ge=0, le=MAX_OUTPUT, description="bytes per stream passed on at most")

    @model_validator(mode="after")
    def _one_command(self) -> ProcessStart:
        if (self.argv is None) == (self.cmd is None):
            raise ValueError("give exactly one of 'argv' (a list of strings) or 'cmd' (a shell command)")
        return self

    def start_args(self) -> dict[str, Any]:
        args = self.model_dump(include={"argv", "cmd", "env", "cwd", "user", "stdin", "tag"}, exclude_none=True)
        if self.pty is not None:
            args["pty"] = self.pty.model_dump()
        return args


class Stdin(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: str = Field("", description="base64", max_length=4 * (MAX_STDIN // 3 + 1))
    eof: bool = False


class Signal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: int | str = Field("SIGTERM", description="a number or a name such as SIGINT")


async def _ndjson(gen: Iterator[dict], limiter: anyio.CapacityLimiter) -> AsyncIterator[bytes]:
    """Drive a sync event generator from worker threads; a broken stream ends with an `error` event."""
    from forkd.base.errors import ForkdError

    try:
        while True:
            try:
                ev = await anyio.to_thread.run_sync(next, gen, None, limiter=limiter)
            except ForkdError as exc:
                yield to_line({"type": "error", "title": type(exc).__name__, "detail": exc.message, "hint": exc.hint})
                return
            if ev is None:
                return
            yield to_line(ev)
    finally:  # also when the client went away: release the child's agent connection
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(gen.close, limiter=limiter)


async def _stream(gen: Iterator[dict], limiter: anyio.CapacityLimiter) -> StreamingResponse:
    first = await anyio.to_thread.run_sync(next, gen, limiter=limiter)  # errors before the start: problem+json

    async def body() -> AsyncIterator[bytes]:
        yield to_line(first)
        async for line in _ndjson(gen, limiter):
            yield line
    return StreamingResponse(body(), media_type=NDJSON)


def build_process_router(s: Service, gate: GuestIO) -> APIRouter:
    """Streams run on a pool of their own (STREAMS); the other calls into the guest on `gate`'s, within its
    per-child and per-client limits."""
    r = APIRouter(tags=["processes"])
    procs = s.processes
    limiter = anyio.CapacityLimiter(STREAMS)
    base = "/v1/sandboxes/{id}/processes"

    @r.post(base, responses={**EVENTS_DOC, 201: {"description": "background: {pid}"}})
    async def start(id: str, req: ProcessStart) -> Any:
        """Start a process: stream its events (NDJSON), or with `background: true` answer {pid} at once."""
        if req.background:
            pid = await anyio.to_thread.run_sync(lambda: procs.start(id, **req.start_args()), limiter=limiter)
            return JSONResponse({"pid": pid}, status_code=201)
        return await _stream(procs.events(id, req.start_args(), max_output=req.max_output, timeout=req.timeout_secs),
                             limiter)

    @r.get(base + "/{pid}/output", responses=EVENTS_DOC)
    async def attach(id: str, pid: int, max_output: int = Query(MAX_OUTPUT, ge=0, le=MAX_OUTPUT)) -> Any:
        """Stream a running process's output not read yet, then its exit."""
        return await _stream(procs.attach(id, pid, max_output=max_output), limiter)

    @r.get(base)
    async def list_processes(request: Request, id: str) -> list[dict[str, Any]]:
        return await gate.run(id, request, procs.list, id)

    @r.post(base + "/{pid}/stdin")
    async def stdin(request: Request, id: str, pid: int, req: Stdin) -> dict[str, int]:
        try:
            data = base64.b64decode(req.data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("stdin 'data' is not base64") from None
        return {"written": await gate.run(id, request, procs.send_stdin, id, pid, data, req.eof)}

    @r.post(base + "/{pid}/resize")
    async def resize(request: Request, id: str, pid: int, req: PtySize) -> dict[str, int]:
        await gate.run(id, request, procs.resize, id, pid, req.rows, req.cols)
        return {"pid": pid}

    @r.post(base + "/{pid}/signal")
    async def signal(request: Request, id: str, pid: int, req: Signal) -> dict[str, Any]:
        return {"pid": pid, "sent": await gate.run(id, request, procs.signal, id, pid, req.signal)}

    @r.post(base + "/{pid}/wait")
    async def wait(request: Request, id: str, pid: int, timeout: float = Query(60.0, ge=0, le=60)) -> dict[str, Any]:
        """The process's entry once it exited, or after `timeout` seconds (`running` says which)."""
        return await gate.run(id, request, procs.wait, id, pid, timeout)

    @r.get("/v1/sandboxes/{id}/logs", tags=["sandboxes"])
    def logs(id: str, offset: int = Query(0, ge=0)) -> dict[str, Any]:
        """The child's console log from byte `offset`: {offset: where the next call starts, data: base64}."""
        res = procs.logs(id, offset)
        return {"offset": res["offset"], "data": base64.b64encode(res["data"]).decode()}

    @r.delete(base + "/{pid}")
    async def kill(request: Request, id: str, pid: int) -> dict[str, Any]:
        return {"pid": pid, "sent": await gate.run(id, request, procs.kill, id, pid)}

    return r


