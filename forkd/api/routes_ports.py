"""Ports of a sandbox over HTTP through the daemon (the service holds the
grants and makes the connection: forkd.service.guest):

  POST   /v1/sandboxes/{id}/ports {port}      open one: 201 {id, sandbox_id, port, token, path} (a new grant)
  GET    /v1/sandboxes/{id}/ports             the grants, without tokens
  DELETE /v1/sandboxes/{id}/ports/{grant}     revoke one grant (its id), or every grant of a port (a number): 204
  ANY    /v1/ports/{id}/{port}/{token}/{path} the guest's http://10.42.0.2:{port}/{path}

The first three are API calls (the daemon's bearer token over TCP). The last is authenticated by the grant's token
alone (shown once, in the POST's answer: the daemon keeps only its hash; the Gate lets PORT_PREFIX through without
the bearer, which is never forwarded to the guest): whoever holds the URL reaches that one port of that one
sandbox until the grant is revoked or the child dies. HTTP/1.1: the
request body is read whole first (at most MAX_BODY bytes), the answer streams. A WebSocket to the same URL is
relayed message by message to a WebSocket handshake with the guest's server (`relay_websocket`); one that asks
for the subprotocol TCP_SUBPROTOCOL carries the port's raw TCP bytes instead (`tunnel_tcp`: `forkd port-forward`).
A child with a network device is reached through its namespace, one without through its guest agent
(forkd.service.guest's connect): the same URLs either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import h11
from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import StreamingResponse
from forkd_client.models import PortGrant, PortGrantInfo
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from forkd.api.auth import PORT_PREFIX
from forkd.api.ports_tcp import TCP_SUBPROTOCOL, tunnel_tcp
from forkd.api.ports_ws import relay_websocket
from forkd.base.errors import ForkdError, InvalidInput, Unavailable
from forkd.client.wire import Strict
from forkd.service import Service

MAX_BODY = 64 << 20
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "authorization", "content-length"})
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class PortRequest(Strict):
    port: int = Field(ge=1, le=65535, description="a TCP port the sandbox's guest listens on")


def _view(g) -> PortGrant:
    return PortGrant(id=g.id, sandbox_id=g.sandbox_id, port=g.port, token=g.token, created_at=g.created_at,
                     path=f"{PORT_PREFIX}{g.sandbox_id}/{g.port}/{g.token}/")


def _info(g) -> PortGrantInfo:
    return PortGrantInfo(id=g.id, sandbox_id=g.sandbox_id, port=g.port, created_at=g.created_at,
                         path=f"{PORT_PREFIX}{g.sandbox_id}/{g.port}/{{token}}/")


def build_ports_router(s: Service) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/sandboxes/{id}/ports", status_code=201, tags=["sandboxes"])
    def open_port(id: str, req: PortRequest) -> PortGrant:
        """A new authenticated path through the daemon to `port` in the sandbox (E2B's get_host). Its token is in
        this answer only: the daemon keeps its hash."""
        return _view(s.open_port(id, req.port))

    @r.get("/v1/sandboxes/{id}/ports", tags=["sandboxes"])
    def list_ports(id: str) -> list[PortGrantInfo]:
        """The sandbox's port grants: ids, ports, paths with the placeholder {token}; never a token."""
        return [_info(g) for g in s.open_ports(id)]

    @r.delete("/v1/sandboxes/{id}/ports/{grant}", status_code=204, tags=["sandboxes"])
    def close_port(id: str, grant: str) -> Response:
        """Revoke the grant with this id, or every grant of this port (a number): their URLs stop working."""
        s.close_port(id, grant)
        return Response(status_code=204)

    async def granted(id: str, port: int, token: str) -> Any:
        """Where the child's `port` is reached when `token` opens it; NotFound (one answer for every refusal)
        else."""
        return await run_in_threadpool(s.granted, id, port, token)

    @r.api_route(PORT_PREFIX + "{id}/{port}/{token}/{path:path}", methods=METHODS, include_in_schema=False)
    async def proxy(id: str, port: int, token: str, path: str, request: Request) -> Response:
        return await _forward(s, await granted(id, port, token), port, path, request)

    @r.websocket(PORT_PREFIX + "{id}/{port}/{token}/{path:path}")
    async def proxy_ws(ws: WebSocket, id: str, port: int, token: str, path: str) -> None:
        try:
            where = await granted(id, port, token)
        except ForkdError:
            await ws.close(code=1008)  # policy violation: the handshake is answered 403
            return
        if TCP_SUBPROTOCOL in (ws.scope.get("subprotocols") or []):
            await tunnel_tcp(ws, s.connect, where, port)
            return
        await relay_websocket(ws, s.connect, where, port, "/" + path + (f"?{ws.url.query}" if ws.url.query else ""))

    return r


def upstream_headers(items, port: int, length: int) -> list[tuple[str, str]]:
    """The headers the guest's server gets: the client's, less hop-by-hop ones and the daemon's Authorization
    (never passed on), with its own Host and the body's length."""
    out = [(k, v) for k, v in items if k.lower() not in HOP_BY_HOP]
    return out + [("host", f"localhost:{port}"), ("connection", "close"), ("content-length", str(length))]


async def _body(request: Request) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise InvalidInput(f"the request body is over {MAX_BODY >> 20} MiB", hint="send less per request")
    return bytes(body)


async def _forward(s: Service, where: Any, port: int, path: str, request: Request) -> Response:
    if (request.headers.get("upgrade") or "").lower() == "websocket":
        raise InvalidInput("WebSocket through a sandbox port is not served", hint="use plain HTTP requests")
    body = await _body(request)
    target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
    headers = upstream_headers(request.headers.items(), port, len(body))
    sock = await run_in_threadpool(s.connect, where, port)
    reader, writer = await asyncio.open_connection(sock=sock)
    conn = h11.Connection(h11.CLIENT)
    try:
        writer.write(conn.send(h11.Request(method=request.method, target=target.encode(), headers=headers)))
        if body:
            writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        head = await _next(conn, reader)
        if not isinstance(head, h11.Response):
            raise Unavailable(f"the server on port {port} gave no HTTP answer", hint="is it an HTTP server?")
    except BaseException:
        writer.close()
        raise
    out = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers
           if k.decode("latin-1").lower() not in HOP_BY_HOP - {"content-length"}}
    return StreamingResponse(_stream(conn, reader, writer), status_code=head.status_code, headers=out)


async def _next(conn: h11.Connection, reader: asyncio.StreamReader):
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise Unavailable(f"the sandbox's server broke HTTP: {exc}") from None
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(1 << 16))


async def _stream(conn: h11.Connection, reader, writer) -> AsyncIterator[bytes]:
    try:
        while True:
            event = await _next(conn, reader)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return
    finally:
        writer.close()
