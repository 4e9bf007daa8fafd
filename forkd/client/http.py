"""The one HTTP client of the daemon's API: where the daemon is, how a request is sent, and how an answer (or the
lack of one) becomes a result or a forkd.base.errors exception.

Used by RemoteBackend (the CLI's remote door), the SDK's Controller/AsyncController and the MCP server, so every
caller gets the same errors: 400/401/422 InvalidInput, 404 NotFound, 409 Conflict, 408/504 Timeout,
502 ProtocolViolation (a child broke the agent protocol), 503 Unavailable, anything else ForkdError; a daemon
that cannot be reached is Unavailable (with a hint), a request that takes too long is
Timeout: never a raw httpx exception.

Where the daemon is (`find_daemon`), first match wins: explicit `url=` / `socket=`, `$FORKD_URL` (TCP, with
`$FORKD_TOKEN`), the local daemon's unix socket ($FORKD_HOME/forkd.sock, from the Layout). An https URL is checked
against `$FORKD_CA` (a PEM bundle, e.g. the daemon's self-signed `--tls-cert`) when set, else the system's CAs.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import TypeAdapter

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound, ProtocolViolation, Timeout, Unavailable
from forkd.base.paths import Layout
from forkd.base.settings import settings

DEFAULT_URL = "http://127.0.0.1:8889"  # upstream's default, for the SDK when no daemon is found
ERRORS: dict[int, type[ForkdError]] = {
    400: InvalidInput, 401: InvalidInput, 403: InvalidInput, 404: NotFound, 408: Timeout, 409: Conflict,
    415: InvalidInput, 421: InvalidInput, 422: InvalidInput, 502: ProtocolViolation, 503: Unavailable, 504: Timeout,
}


@dataclass(frozen=True)
class Endpoint:
    """A daemon: `base_url` over TCP, or `socket` (a unix socket path; base_url is then a dummy host)."""

    base_url: str
    socket: str | None = None
    token: str | None = None

    @property
    def where(self) -> str:
        return self.socket or self.base_url

    @property
    def is_local(self) -> bool:
        """On this host (a unix socket): paths it names (agent sockets, files) are ours too."""
        return self.socket is not None


def _answers(sock: str) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=2.0) as c:
            return c.get("http://forkd/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def find_daemon(url: str | None = None, socket: str | None = None, token: str | None = None,
                probe: bool = False) -> Endpoint | None:
    """The daemon to talk to, or None. `probe`: the local socket counts only if a daemon answers on it (a stale
    socket file left by a killed daemon does not)."""
    env = settings()
    token = token if token is not None else env.token_value
    if url:
        return Endpoint(url.rstrip("/"), None, token)
    if socket:
        return Endpoint("http://forkd", str(socket), token)
    if env.url:
        return Endpoint(env.url.rstrip("/"), None, token)
    sock = Layout.from_env().daemon_socket
    if sock.exists() and (not probe or _answers(str(sock))):
        return Endpoint("http://forkd", str(sock), token)
    return None


class Call:
    """One request: method, path, body; `parse` turns the JSON answer into the result (a TypeAdapter, a callable,
    or None for the JSON itself); `raw` returns the bytes."""

    __slots__ = ("method", "path", "json", "params", "content", "parse", "raw", "timeout")

    def __init__(self, method: str, path: str, json: Any = None, params: dict | None = None,
                 content: bytes | None = None, parse: Any = None, raw: bool = False, timeout: float | None = None):
        self.method, self.path, self.json, self.params = method, path, json, params
        self.content, self.parse, self.raw, self.timeout = content, parse, raw, timeout

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"json": self.json, "params": self.params, "content": self.content}
        if self.content is not None:  # the daemon takes only typed bodies (forkd.api.audit.Gate)
            kw["headers"] = {"Content-Type": "application/octet-stream"}
        if self.timeout is not None:
            kw["timeout"] = self.timeout
        return kw


def quote(segment: str) -> str:
    """Percent-encode one path segment."""
    return httpx.URL(f"/{segment}").raw_path.decode()[1:]


def api_error(status: int, body: Any, url: str) -> ForkdError:
    """The forkd error for a non-2xx answer (problem+json: `detail`, `hint`)."""
    detail = (body.get("detail") or body.get("error") or str(body)) if isinstance(body, dict) else str(body)
    hint = body.get("hint") if isinstance(body, dict) else None
    return ERRORS.get(status, ForkdError)(detail or f"HTTP {status}", hint=hint, status=status, body=body, url=url)


def transport_error(exc: httpx.HTTPError, ep: Endpoint, call: Call) -> ForkdError:
    """A request that got no answer: Unavailable (cannot connect) or Timeout, naming the daemon."""
    where = f"{call.method} {ep.where}{call.path}"
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return Timeout(f"{where}: the daemon did not answer in time ({type(exc).__name__})",
                       hint="the operation may still be running on the daemon; check with 'forkd ls' or "
                            "'forkd snapshots', or raise the client timeout")
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return Unavailable(f"the forkd daemon at {ep.where} has a TLS certificate this client does not trust: {exc}",
                           hint="set FORKD_CA to the PEM file of the daemon's certificate or its CA")
    if isinstance(exc, httpx.TransportError):
        return Unavailable(f"cannot reach the forkd daemon at {ep.where}: {exc or type(exc).__name__}",
                           hint="start it with 'forkd serve' (add --bind HOST:PORT for TCP), or fix or unset "
                                "FORKD_URL; FORKD_NO_DAEMON=1 runs the command in-process")
    return ForkdError(f"{where} failed: {exc}")


def result(call: Call, r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            body = r.text
        raise api_error(r.status_code, body, str(r.request.url))
    if call.raw:
        return r.content
    if not r.content:
        return None
    data = r.json()
    if call.parse is None:
        return data
    if isinstance(call.parse, TypeAdapter):
        return call.parse.validate_python(data)
    return call.parse(data)


def _headers(ep: Endpoint) -> dict[str, str]:
    return {"Authorization": f"Bearer {ep.token}"} if ep.token else {}


def tls_verify(ep: Endpoint) -> Any:
    """What httpx checks an https daemon's certificate against: $FORKD_CA when set, else the system's CAs."""
    ca = settings().ca
    if ca is None or ep.socket is not None:
        return True
    if not ca.is_file():
        raise InvalidInput(f"FORKD_CA={str(ca)!r} is not a file", hint="point FORKD_CA at a PEM bundle, or unset it")
    return ssl.create_default_context(cafile=str(ca))


class SyncHttp:
    """Sends Calls synchronously to one Endpoint."""

    def __init__(self, endpoint: Endpoint, timeout: float = 600.0):
        self.endpoint = endpoint
        transport = httpx.HTTPTransport(uds=endpoint.socket) if endpoint.socket else None
        self._http = httpx.Client(base_url=endpoint.base_url, transport=transport, headers=_headers(endpoint),
                                  timeout=timeout, verify=tls_verify(endpoint))

    def _send(self, call: Call) -> Any:
        try:
            r = self._http.request(call.method, call.path, **call.kwargs())
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.endpoint, call) from exc
        return result(call, r)

    def close(self) -> None:
        self._http.close()


class AsyncHttp:
    """Sends Calls as coroutines to one Endpoint."""

    def __init__(self, endpoint: Endpoint, timeout: float = 600.0):
        self.endpoint = endpoint
        transport = httpx.AsyncHTTPTransport(uds=endpoint.socket) if endpoint.socket else None
        self._http = httpx.AsyncClient(base_url=endpoint.base_url, transport=transport, headers=_headers(endpoint),
                                       timeout=timeout, verify=tls_verify(endpoint))

    async def _send(self, call: Call) -> Any:
        try:
            r = await self._http.request(call.method, call.path, **call.kwargs())
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.endpoint, call) from exc
        return result(call, r)

    async def aclose(self) -> None:
        await self._http.aclose()
