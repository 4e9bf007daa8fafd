"""A WebSocket to a sandbox's port, relayed message by message: the daemon accepts the client's WebSocket only once
the guest's server accepted the daemon's own handshake (wsproto, over a connection made in the child's namespace or
relayed by its agent: forkd.service.guest's connect), then copies text and binary messages both ways until either
side closes. A message over MAX_MESSAGE bytes closes both (1009)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from fastapi import WebSocket
from starlette.concurrency import run_in_threadpool
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

from forkd.base.errors import ForkdError

MAX_MESSAGE = 16 << 20


async def relay_websocket(ws: WebSocket, connect: Callable[[Any, int], socket.socket], where: Any, port: int,
                          target: str) -> None:
    """`connect(where, port)`: a TCP connection to the guest's port (through its namespace or its agent)."""
    try:
        sock = await run_in_threadpool(connect, where, port)
    except ForkdError:
        await ws.close(code=1011)
        return
    reader, writer = await asyncio.open_connection(sock=sock)
    conn = WSConnection(ConnectionType.CLIENT)
    try:
        writer.write(conn.send(Request(host=f"localhost:{port}", target=target,
                                       subprotocols=list(ws.scope.get("subprotocols") or []))))
        await writer.drain()
        accepted = await _handshake(conn, reader)
        if accepted is None:
            await ws.close(code=1011)
            return
        await ws.accept(subprotocol=accepted.subprotocol)
        await _pump(ws, conn, reader, writer)
    finally:
        writer.close()


async def _handshake(conn: WSConnection, reader: asyncio.StreamReader) -> AcceptConnection | None:
    while True:
        data = await reader.read(1 << 16)
        conn.receive_data(data or None)
        for event in conn.events():
            if isinstance(event, AcceptConnection):
                return event
            if isinstance(event, RejectConnection):
                return None
        if not data:
            return None


async def _pump(ws: WebSocket, conn: WSConnection, reader, writer) -> None:
    tasks = [asyncio.create_task(_to_guest(ws, conn, writer)), asyncio.create_task(_to_client(ws, conn, reader,
                                                                                               writer))]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    for t in done:
        t.exception()  # retrieved: a side that broke just ends the relay


async def _to_guest(ws: WebSocket, conn: WSConnection, writer) -> None:
    while True:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            _send(conn, writer, CloseConnection(code=msg.get("code") or 1000))
            return
        data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
        if data is not None:
            _send(conn, writer, Message(data=data))
            await writer.drain()


async def _to_client(ws: WebSocket, conn: WSConnection, reader, writer) -> None:
    parts: list = []
    while True:
        data = await reader.read(1 << 16)
        conn.receive_data(data or None)
        for event in conn.events():
            if isinstance(event, TextMessage | BytesMessage):
                parts.append(event.data)
                if sum(len(p) for p in parts) > MAX_MESSAGE:
                    await ws.close(code=1009)
                    return
                if event.message_finished:
                    whole = "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)
                    parts = []
                    await (ws.send_text(whole) if isinstance(whole, str) else ws.send_bytes(whole))
            elif isinstance(event, Ping):
                _send(conn, writer, event.response())
            elif isinstance(event, CloseConnection):
                _send(conn, writer, event.response())
                await ws.close(code=event.code)
                return
        if not data:
            await ws.close(code=1011)
            return


def _send(conn: WSConnection, writer, event) -> None:
    try:
        writer.write(conn.send(event))
    except LocalProtocolError:  # the connection already closed on that side
        pass
