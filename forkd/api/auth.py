"""Who may call the API, and who they are in the audit log.

* Unix socket (the default): the socket file is 0600, so the file system already limits callers to the daemon's
  user (and root). Such callers are `unix:<uid>` (the peer's uid from SO_PEERCRED when uvicorn exposes the socket,
  else the daemon's own uid, the only one the mode lets in besides root).
* TCP (`--bind HOST:PORT`): every route except `/healthz` needs `Authorization: Bearer <token>`, compared in
  constant time (hmac.compare_digest). A non-loopback bind without a token is refused at start-up; a loopback
  bind without one is allowed (any local user can then drive the daemon: say so in the log).
  Callers are the token id (sha256 of the token, first 12 hex digits).

The token file holds base64 of 32 random bytes, mode 0600; `load_or_create_token` makes one if it is missing and
refuses a file others can read.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
import struct
from pathlib import Path

from forkd.base.atomic import create_new
from forkd.base.errors import InvalidInput
from forkd.core.audit import token_id

DEFAULT_PORT = 8889
OPEN_PATHS = frozenset({"/healthz"})
TRANSPORT_KEY = "forkd.transport"  # set in the ASGI scope by the TCP listener's wrapper


def parse_bind(bind: str) -> tuple[str, int]:
    """'HOST:PORT', 'HOST', ':PORT' or '[v6]:PORT' -> (host, port); port defaults to upstream's 8889."""
    host, port = bind, DEFAULT_PORT
    if bind.startswith("["):
        host, _, rest = bind[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif bind.count(":") == 1:
        host, p = bind.split(":")
        port = int(p) if p else DEFAULT_PORT
    host = host or "127.0.0.1"
    if not 0 <= port <= 65535:
        raise InvalidInput(f"--bind {bind!r}: port out of range")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def new_token() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def load_or_create_token(path: Path) -> str:
    """Read the token file (which must be 0600 or stricter), creating it with a fresh token if missing."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another daemon made it meanwhile: use theirs
            create_new(path, (new_token() + "\n").encode(), 0o600)
    st = path.stat()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput(f"token file {path} is mode {st.st_mode & 0o777:o}: others can read it",
                           hint=f"chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 16:
        raise InvalidInput(f"token file {path} holds a token shorter than 16 characters",
                           hint="delete it and let forkd make one (base64 of 32 random bytes)")
    return token


def check_bind(host: str, token: str | None) -> None:
    if token is None and not is_loopback(host):
        raise InvalidInput(f"refusing to listen on {host} without a token: anyone who reaches it could run code",
                           hint="pass --token-file PATH (created if missing), or bind to 127.0.0.1")


def bearer_ok(header: str | None, token: str) -> bool:
    if not header or not header.lower().startswith("bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def peer_uid(scope: dict) -> int:
    """The connecting process's uid on the unix socket (SO_PEERCRED), else our own."""
    transport = scope.get("transport") or (scope.get("extensions") or {}).get("transport")
    sock = getattr(transport, "get_extra_info", lambda _k: None)("socket") if transport else None
    if sock is not None:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return struct.unpack("3i", creds)[1]
        except OSError:
            pass
    return os.getuid()


def actor_of(scope: dict, token: str | None) -> str:
    if scope.get(TRANSPORT_KEY) == "tcp":
        return token_id(token) if token else "tcp:anonymous"
    return f"unix:{peer_uid(scope)}"


class TagTransport:
    """ASGI wrapper for the TCP listener: marks its requests so auth applies to them (not to the unix socket)."""

    def __init__(self, app, transport: str = "tcp"):
        self.app, self.transport = app, transport

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = dict(scope)
            scope[TRANSPORT_KEY] = self.transport
        await self.app(scope, receive, send)
