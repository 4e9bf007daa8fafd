"""Who may call the API, and who they are in the audit log.

* Unix socket (the default): created 0600 inside a fresh 0700 directory and only then renamed into place
  (forkd.api.daemon.bind_unix), so no other user can ever connect to it; every connection's peer credentials
  (SO_PEERCRED) are checked as well, and a peer that is neither the daemon's uid nor root is dropped before a byte
  is read (`peer_checked`). Callers are `unix:<uid>`, the peer's real uid.
* TCP (`--bind HOST:PORT`): needs `--token-file` on every address, loopback included (a web page can reach
  loopback); every route except `/healthz` needs `Authorization: Bearer <token>`, compared in constant time
  (hmac.compare_digest). The Host header must name the bound address, the connection's local address,
  `localhost`, or a name given with `--allow-host` (DNS rebinding sends the attacker's name): others get 421.
  Optional TLS (`--tls-cert/--tls-key`). Callers are the token id (sha256 of the token, first 12 hex digits).

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
PORT_PREFIX = "/v1/ports/"  # a sandbox's port: authenticated by its grant's token (forkd.api.routes_ports)
TRANSPORT_KEY = "forkd.transport"  # set in the ASGI scope by the TCP listener's wrapper
PEER_KEY = "forkd.peer_uid"  # set in the ASGI scope by the unix listener's protocol (peer_checked)
PEER_PID_KEY = "forkd.peer_pid"  # the same peer's pid


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
    if token is None:
        raise InvalidInput(f"refusing to listen on TCP {host} without a token: any local user, and any web page "
                           f"a browser on this host opens, could reach it and run code",
                           hint="pass --token-file PATH (made 0600 with a fresh token if missing; clients send it "
                                "as FORKD_TOKEN), e.g. --token-file $FORKD_HOME/api.token")


def _host_name(header: str) -> str:
    """The name part of a Host header, lowercased: 'Example.org:80' -> 'example.org', '[::1]:8889' -> '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:].partition("]")[0]
    if h.count(":") == 1:
        h = h.partition(":")[0]
    return h.rstrip(".")


def allowed_hosts(bind_host: str, extra: list[str] | tuple[str, ...] = ()) -> frozenset[str]:
    """The Host names a TCP listener answers: its bound address, `localhost` and loopback literals when it is on
    loopback, and the operator's `--allow-host` names (the connection's own local address is added per request)."""
    names = {_host_name(bind_host), "localhost", *(_host_name(n) for n in extra)}
    if is_loopback(bind_host):
        names |= {"127.0.0.1", "::1"}
    return frozenset(n for n in names if n)


def host_ok(scope: dict, allowed: frozenset[str]) -> bool:
    """Does the request's Host header name this daemon (not a DNS-rebound attacker name)?"""
    values = [v for k, v in scope.get("headers") or () if k.lower() == b"host"]
    if len(values) != 1:
        return False
    name = _host_name(values[0].decode("latin-1"))
    local = (scope.get("server") or (None,))[0]
    return bool(name) and (name in allowed or (local is not None and name == _host_name(str(local))))


def bearer_ok(header: str | None, token: str) -> bool:
    if not header or not header.lower().startswith("bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def peer_creds(sock) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of a unix socket's peer (SO_PEERCRED), None when unknown."""
    if sock is None:
        return None
    try:
        return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError, struct.error):
        return None


def peer_uid(scope: dict) -> int:
    """The connecting process's uid on the unix socket (set by peer_checked), else our own."""
    uid = scope.get(PEER_KEY)
    return uid if isinstance(uid, int) else os.getuid()


def peer_checked(base: type, on_refused=None) -> type:
    """A uvicorn HTTP protocol class for the unix listener: a peer that is neither our uid nor root is dropped as
    it connects (before any request is read); an accepted peer's uid goes into every request's scope."""
    allowed = {0, os.getuid()}

    class PeerChecked(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            creds = peer_creds(transport.get_extra_info("socket"))
            if creds is None or creds[1] not in allowed:
                transport.abort()
                if on_refused is not None:
                    on_refused(f"unix:{creds[1] if creds else 'unknown'}")
                return
            inner, pid, uid = self.app, creds[0], creds[1]

            async def app(scope, receive, send):
                scope[PEER_KEY], scope[PEER_PID_KEY] = uid, pid
                await inner(scope, receive, send)

            self.app = app

    return PeerChecked


def actor_of(scope: dict, token: str | None) -> str:
    if scope.get(TRANSPORT_KEY) == "tcp":
        return token_id(token) if token else "tcp:anonymous"
    return f"unix:{peer_uid(scope)}"


def client_of(scope: dict) -> str:
    """Who is calling, for per-client limits: a TCP peer's address (every TCP caller holds the one token), or a
    unix socket peer's process."""
    if scope.get(TRANSPORT_KEY) == "tcp":
        peer = scope.get("client")
        return f"tcp:{peer[0] if peer else 'unknown'}"
    pid = scope.get(PEER_PID_KEY)
    return f"unix:{peer_uid(scope)}:{pid}" if isinstance(pid, int) else f"unix:{peer_uid(scope)}"


class TagTransport:
    """ASGI wrapper for the TCP listener: marks its requests so auth applies to them (not to the unix socket)."""

    def __init__(self, app, transport: str = "tcp"):
        self.app, self.transport = app, transport

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = dict(scope)
            scope[TRANSPORT_KEY] = self.transport
        await self.app(scope, receive, send)
