"""Raw TCP to a sandbox's port, tunnelled in a WebSocket: a client that asks for the subprotocol TCP_SUBPROTOCOL on
a port URL (forkd.api.routes_ports) gets the guest port's bytes as binary messages, and its binary messages are
the bytes sent to it (`forkd port-forward` listens on a local port and opens one such tunnel per connection).

The WebSocket is accepted only once the connection to the guest's port is made (through the child's namespace or
its agent: forkd.service.guest's connect); a refused one closes the handshake (403). A text message, or a binary
one over MAX_MESSAGE bytes, closes the tunnel (1003 / 1009); so does IDLE seconds without a byte either way. An
empty binary message is the client's half-close (its side of the TCP connection is shut; the server's answer still
comes back); the guest's server closing its side closes the WebSocket (1000), and the client's close ends the TCP
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

from fastapi import WebSocket
from starlette.concurrency import run_in_threadpool

from forkd.base.errors import ForkdError

TCP_SUBPROTOCOL = "forkd.tcp"
MAX_MESSAGE = 1 << 20
READ = 1 << 16
IDLE = 300.0


async def tunnel_tcp(ws: WebSocket, connect: Callable[[Any, int], socket.socket], where: Any, port: int,
                     idle: float = IDLE) -> None:
    """Carry the bytes of a TCP connection to the guest's `port` over `ws` until either side ends it."""
    try:
        sock = await run_in_threadpool(connect, where, port)
    except ForkdError:
        await ws.close(code=1008)
        return
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        await ws.accept(subprotocol=TCP_SUBPROTOCOL)
        last = [time.monotonic()]
        tasks = [asyncio.create_task(_to_guest(ws, writer, last)), asyncio.create_task(_to_client(ws, reader, last)),
                 asyncio.create_task(_watch(last, idle))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        code = next((t.result() for t in done if not t.cancelled() and t.exception() is None), 1011)
        if code is not None:
            with contextlib.suppress(RuntimeError, OSError):
                await ws.close(code=code)
    finally:
        writer.close()


async def _to_guest(ws: WebSocket, writer: asyncio.StreamWriter, last: list[float]) -> int | None:
    while True:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return None
        data = msg.get("bytes")
        if data is None:
            return 1003  # text: not TCP bytes
        if len(data) > MAX_MESSAGE:
            return 1009
        last[0] = time.monotonic()
        if not data:  # the client's side is done: half-close, the server's answer still comes back
            if writer.can_write_eof():
                writer.write_eof()
            continue
        writer.write(data)
        await writer.drain()


async def _to_client(ws: WebSocket, reader: asyncio.StreamReader, last: list[float]) -> int:
    while True:
        data = await reader.read(READ)
        if not data:
            return 1000
        last[0] = time.monotonic()
        await ws.send_bytes(data)


async def _watch(last: list[float], idle: float) -> int:
    while True:
        left = last[0] + idle - time.monotonic()
        if left <= 0:
            return 1001  # going away: idle too long
        await asyncio.sleep(left)
