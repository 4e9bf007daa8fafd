"""The raw TCP tunnel of a port URL (forkd.api.ports_tcp) without VMs: its `connect` reaches a real TCP echo server
on this host's loopback instead of a guest port (tests/test_ports_relay.py drives `forkd port-forward` against real
children); the WebSocket side is Starlette's test client."""

from __future__ import annotations

import socket
import threading

import pytest
from fastapi import FastAPI, WebSocket
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from forkd.api.ports_tcp import MAX_MESSAGE, TCP_SUBPROTOCOL, tunnel_tcp
from forkd.base.errors import Unavailable


@pytest.fixture(scope="module")
def echo_port():
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def _echo(c: socket.socket) -> None:
    with c:
        while data := c.recv(1 << 16):
            if data == b"bye":
                return  # the server closes its side
            c.sendall(data)


def _client(idle: float = 300.0, refuse: bool = False) -> TestClient:
    app = FastAPI()

    def connect(where, port):
        if refuse:
            raise Unavailable("nothing answers")
        return socket.create_connection(("127.0.0.1", port))

    @app.websocket("/t/{port}")
    async def t(ws: WebSocket, port: int) -> None:
        await tunnel_tcp(ws, connect, None, port, idle=idle)

    return TestClient(app)


def test_bytes_go_both_ways_and_the_servers_close_closes_the_tunnel(echo_port):
    with _client().websocket_connect(f"/t/{echo_port}", subprotocols=[TCP_SUBPROTOCOL]) as ws:
        assert ws.accepted_subprotocol == TCP_SUBPROTOCOL
        payload = bytes(range(256)) * 1000
        ws.send_bytes(payload)
        got = b""
        while len(got) < len(payload):
            got += ws.receive_bytes()
        assert got == payload
        ws.send_bytes(b"bye")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == 1000


@pytest.mark.parametrize(("send", "code"), [("text", 1003), ("oversized", 1009)])
def test_a_message_that_is_not_tcp_bytes_closes_the_tunnel(echo_port, send, code):
    with _client().websocket_connect(f"/t/{echo_port}", subprotocols=[TCP_SUBPROTOCOL]) as ws:
        if send == "text":
            ws.send_text("not bytes")
        else:
            ws.send_bytes(bytes(MAX_MESSAGE + 1))
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == code


def test_an_idle_tunnel_is_closed(echo_port):
    with _client(idle=0.5).websocket_connect(f"/t/{echo_port}", subprotocols=[TCP_SUBPROTOCOL]) as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()  # nothing moves either way: the tunnel's idle clock ends it
        assert closed.value.code == 1001


def test_a_port_that_does_not_answer_refuses_the_handshake(echo_port):
    with pytest.raises(WebSocketDisconnect) as refused:
        with _client(refuse=True).websocket_connect(f"/t/{echo_port}", subprotocols=[TCP_SUBPROTOCOL]):
            pass
    assert refused.value.code == 1008


def test_an_empty_message_is_a_half_close_and_the_answer_still_comes(echo_port):
    with _client().websocket_connect(f"/t/{echo_port}", subprotocols=[TCP_SUBPROTOCOL]) as ws:
        payload = bytes(range(256)) * 4000
        ws.send_bytes(payload)
        ws.send_bytes(b"")  # done sending: the echo server sees EOF after the bytes, answers them, then closes
        got = b""
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                got += ws.receive_bytes()
        assert got == payload and closed.value.code == 1000
