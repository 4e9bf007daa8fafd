"""`forkd port-forward`: a local TCP port whose connections reach a sandbox's port as raw TCP, each one a WebSocket
tunnel through the daemon (subprotocol `forkd.tcp`: forkd.api.ports_tcp) on the port's granted URL.

The tunnel speaks WebSocket with wsproto over a plain socket: the daemon's unix socket, or TCP (TLS for https,
verified as every client of the daemon verifies it: against `$FORKD_CA` when set, else the system's CAs). The
grant's token is in the path.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from forkd.base.errors import ForkdError, Unavailable

TCP_SUBPROTOCOL = "forkd.tcp"
READ = 1 << 16
HANDSHAKE_LIMIT = 64 << 10  # bytes of the daemon's handshake answer read before giving up


def dial(base_url: str, unix_socket: str | None, timeout: float = 30.0) -> socket.socket:
    """A stream to the daemon: its unix socket, or base_url's host and port (TLS for https)."""
    if unix_socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(unix_socket)
        return s
    u = urlsplit(base_url)
    s = socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout)
    if u.scheme == "https":
        from forkd_client.http import Endpoint, tls_verify

        verify = tls_verify(Endpoint(base_url))
        ctx = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        try:
            s = ctx.wrap_socket(s, server_hostname=u.hostname)
        except ssl.SSLCertVerificationError as exc:
            s.close()
            raise Unavailable(f"the forkd daemon at {base_url} has a TLS certificate this client does not trust: "
                              f"{exc.verify_message}",
                              hint="set FORKD_CA to the PEM file of the daemon's certificate or its CA") from None
    return s


def open_tunnel(base_url: str, unix_socket: str | None, path: str) -> tuple[socket.socket, object]:
    """(the stream, its wsproto connection: it holds what came after the handshake) of a tunnel to the grant
    `path`."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, RejectConnection, Request

    s = dial(base_url, unix_socket)
    conn = WSConnection(ConnectionType.CLIENT)
    host = urlsplit(base_url).netloc or "forkd"
    s.sendall(conn.send(Request(host=host, target=path, subprotocols=[TCP_SUBPROTOCOL])))
    seen = 0
    while seen < HANDSHAKE_LIMIT:
        data = s.recv(READ)
        seen += len(data)
        conn.receive_data(data or None)
        for ev in conn.events():
            if isinstance(ev, AcceptConnection):
                s.settimeout(None)
                return s, conn
            if isinstance(ev, RejectConnection):
                s.close()
                raise Unavailable(f"the daemon refused the tunnel to {path.split('/')[3:5]} (HTTP {ev.status_code})",
                                  hint="is the port open (forkd port ID PORT), the sandbox running, and something "
                                       "listening on that port in it?")
        if not data:
            break
    s.close()
    raise Unavailable("the daemon closed the tunnel during its handshake", hint="see the daemon's log")


def pump(client: socket.socket, tunnel: socket.socket, conn) -> None:
    """Copy bytes between a local connection and a tunnel until either ends, then close both."""
    from wsproto.events import BytesMessage, CloseConnection, Message, Ping

    lock = threading.Lock()

    def send(event) -> None:
        with lock, contextlib.suppress(Exception):
            tunnel.sendall(conn.send(event))

    def up() -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(READ):
                send(Message(data=data))
        send(Message(data=b""))  # a half-close: the server's answer still comes back, then the tunnel closes

    threading.Thread(target=up, daemon=True).start()
    try:
        while True:
            for ev in conn.events():  # first: what came with the handshake
                if isinstance(ev, BytesMessage):
                    client.sendall(ev.data)
                elif isinstance(ev, Ping):
                    send(ev.response())
                elif isinstance(ev, CloseConnection):
                    return
            data = tunnel.recv(READ)
            if not data:
                return
            conn.receive_data(data)
    except (OSError, ForkdError):
        return
    finally:
        for s in (client, tunnel):
            with contextlib.suppress(OSError):
                s.close()


def serve(listener: socket.socket, connect: Callable[[], tuple[socket.socket, object]],
          on_error: Callable[[Exception], None]) -> None:
    """Accept on `listener` forever; each connection gets its own tunnel (`connect()`) and pump thread."""
    while True:
        client, _ = listener.accept()

        def run(client: socket.socket = client) -> None:
            try:
                tunnel, conn = connect()
            except (ForkdError, OSError) as exc:
                on_error(exc)
                client.close()
                return
            pump(client, tunnel, conn)

        threading.Thread(target=run, daemon=True).start()
