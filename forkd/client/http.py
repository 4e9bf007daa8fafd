"""The runtime's door to a daemon's API: where the daemon is, as the runtime finds it, and what to do when it
cannot be reached. How a request is sent (retries on connect errors and 503), and how an answer (or the lack of
one) becomes a result or an error, is the light client's transport (forkd_client.http), re-exported here: the CLI's
RemoteBackend, the MCP server and the SDK send the same way and raise the same kinds (forkd.base.errors):
400/401/422 InvalidInput, 404 NotFound, 409 Conflict, 408/504 Timeout, 502 ProtocolViolation, 503 Unavailable,
anything else ForkdError; a daemon that cannot be reached (after the retries) is Unavailable with `UNREACHABLE`'s
hint, a request that takes too long is Timeout: never a raw httpx exception.

Where the daemon is (`find_daemon`), first match wins: explicit `url=` / `socket=`, `$FORKD_URL` (TCP, with
`$FORKD_TOKEN`), the local daemon's unix socket (the Layout's, under $FORKD_HOME). An https URL is checked against
`$FORKD_CA` (a PEM bundle, e.g. the daemon's self-signed `--tls-cert`) when set, else the system's CAs.
"""

from __future__ import annotations

from forkd_client.errors import api_error
from forkd_client.http import (
    DEFAULT_URL,
    AsyncHttp,
    Call,
    Endpoint,
    Retry,
    SyncHttp,
    answer,
    quote,
    transport_error,
)

__all__ = ["DEFAULT_URL", "UNREACHABLE", "AsyncHttp", "Call", "Endpoint", "Retry", "SyncHttp", "answer",
           "api_error", "find_daemon", "quote", "transport_error"]

UNREACHABLE = ("start it with 'forkd serve' (add --bind HOST:PORT for TCP), or fix or unset FORKD_URL; "
               "FORKD_NO_DAEMON=1 runs the command in-process")


def _answers(sock: str) -> bool:
    import httpx  # here, as the settings below: a caller with its own transport (the CLI) loads neither

    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=2.0) as c:
            return c.get("http://forkd/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def find_daemon(url: str | None = None, socket: str | None = None, token: str | None = None,
                probe: bool = False) -> Endpoint | None:
    """The daemon to talk to, or None. `probe`: the local socket counts only if a daemon answers on it (a stale
    socket file left by a killed daemon does not)."""
    from forkd.base.paths import Layout
    from forkd.base.settings import settings

    env = settings()
    token = token if token is not None else env.token_value
    if url:
        return Endpoint(url.rstrip("/"), None, token)
    if socket:
        return Endpoint("http://forkd", str(socket), token)
    if env.url:
        return Endpoint(env.url.rstrip("/"), None, token)
    if env.daemon_socket:  # named explicitly: that daemon or an error, never a silent fall-back
        return Endpoint("http://forkd", str(env.daemon_socket), token)
    sock = Layout.from_env().daemon_socket
    if sock.exists() and (not probe or _answers(str(sock))):
        return Endpoint("http://forkd", str(sock), token)
    return None
