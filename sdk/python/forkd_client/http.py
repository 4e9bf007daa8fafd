"""Where the daemon is, how one request is sent (with retries), and how an answer becomes a result or an error.
The one transport of forkd's clients: the runtime's front door (forkd.client.http, the CLI's remote backend) sends
through these classes too, with its own discovery of the daemon and its own hint.

Where, first match wins: `url=` / `socket=` arguments, `$FORKD_URL` (TCP, with `$FORKD_TOKEN`), the local daemon's
unix socket (`$FORKD_DAEMON_SOCKET`, else `$FORKD_HOME/forkd.sock`, `$FORKD_HOME` defaulting to /var/lib/forkd),
else upstream's default http://127.0.0.1:8889 (an error reaching it names the places tried before it). An https
URL is checked against `$FORKD_CA` when set.

Retries (`Retry`): a request that could not connect (the daemon is restarting, or not up yet) is sent again, whatever
its method, since it never reached the daemon; a 503 answer is retried only for idempotent methods (GET, HEAD,
PUT, DELETE), since a POST may have done part of its work. Waits grow 0.25 s, 0.5 s, 1 s... (at most `max_wait`),
with jitter, `attempts` times in all (default 4). Then the error is raised: `Unavailable` naming the daemon.
The defaults come from `$FORKD_RETRY_ATTEMPTS` and `$FORKD_RETRY_WAIT` (the first wait, seconds) when set: the retry
budget of every client in a process tree (the CLI, scripts, tests), without code.
Streamed answers (`stream`) are opened the same way; once open, nothing is sent again.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkd_client.errors import ForkdError, InvalidInput, Timeout, Unavailable, api_error

DEFAULT_URL = "http://127.0.0.1:8889"
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
if TYPE_CHECKING:
    import httpx

UNREACHABLE = ("start it with 'forkd serve' (add --bind HOST:PORT for TCP), or pass url=/socket= or set FORKD_URL "
               "to where it listens")


@dataclass(frozen=True)
class Endpoint:
    """A daemon: `base_url` over TCP, or `socket` (a unix socket path; base_url is then a dummy host)."""

    base_url: str
    socket: str | None = None
    token: str | None = None
    tried: tuple[str, ...] = ()  # where discovery looked first and found no daemon (named when this one fails too)

    @property
    def where(self) -> str:
        return self.socket or self.base_url

    @property
    def is_local(self) -> bool:
        """On this host (a unix socket): paths it names (agent sockets, files) are ours too."""
        return self.socket is not None


def _env_number(name: str, default: float, kind: type, least: float) -> Any:
    """A retry setting from the environment (blank = unset); a value that does not parse is an error naming it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return kind(default)
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidInput(f"{name}={raw!r} is not a {kind.__name__}", hint=f"set it to a number >= {least}, or "
                           "unset it") from None
    if value < least:
        raise InvalidInput(f"{name}={raw!r} is less than {least}", hint=f"set it to a number >= {least}")
    return value


@dataclass(frozen=True)
class Retry:
    attempts: int = field(default_factory=lambda: _env_number("FORKD_RETRY_ATTEMPTS", 4, int, 1))
    first_wait: float = field(default_factory=lambda: _env_number("FORKD_RETRY_WAIT", 0.25, float, 0))
    max_wait: float = 4.0

    def wait(self, attempt: int) -> float:
        import random

        return min(self.max_wait, self.first_wait * 2 ** attempt) * random.uniform(0.8, 1.2)

    def again(self, attempt: int, method: str, exc: BaseException | None, status: int | None) -> bool:
        if attempt + 1 >= self.attempts:
            return False
        if exc is not None:
            import httpx

            return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout) and "CERTIFICATE" not in str(exc)
        return status == 503 and method.upper() in IDEMPOTENT


def local_socket() -> Path:
    explicit = os.environ.get("FORKD_DAEMON_SOCKET")
    return Path(explicit) if explicit else Path(os.environ.get("FORKD_HOME") or "/var/lib/forkd") / "forkd.sock"


def find_daemon(url: str | None = None, socket: str | os.PathLike | None = None,
                token: str | None = None) -> Endpoint:
    token = token if token is not None else (os.environ.get("FORKD_TOKEN") or None)
    if url:
        return Endpoint(url.rstrip("/"), None, token)
    if socket:
        return Endpoint("http://forkd", str(socket), token)
    if os.environ.get("FORKD_URL"):
        return Endpoint(os.environ["FORKD_URL"].rstrip("/"), None, token)
    sock = local_socket()
    if sock.exists():
        return Endpoint("http://forkd", str(sock), token)
    named_by = "$FORKD_DAEMON_SOCKET" if os.environ.get("FORKD_DAEMON_SOCKET") else (
        "$FORKD_HOME/forkd.sock" if os.environ.get("FORKD_HOME") else "/var/lib/forkd/forkd.sock: $FORKD_HOME unset")
    tried = ("url=/socket= arguments: none given", "$FORKD_URL: not set",
             f"the local daemon's socket {sock} ({named_by}): no such file")
    return Endpoint(DEFAULT_URL, None, token, tried)


class Call:
    """One request; `parse` turns the JSON answer into the result (None: the JSON itself); `raw`: the bytes."""

    __slots__ = ("method", "path", "json", "params", "content", "parse", "raw", "timeout")

    def __init__(self, method: str, path: str, json: Any = None, params: dict | None = None,
                 content: Any = None, parse: Any = None, raw: bool = False, timeout: Any = None):
        self.method, self.path, self.json, self.params = method, path, json, params
        self.content, self.parse, self.raw, self.timeout = content, parse, raw, timeout

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"json": self.json, "params": self.params, "content": self.content}
        if self.content is not None:  # the daemon takes only typed bodies
            kw["headers"] = {"Content-Type": "application/octet-stream"}
        if self.timeout is not None:
            kw["timeout"] = self.timeout
        return kw


def quote(segment: str) -> str:
    """Percent-encode one path segment as httpx encodes a path (the URL standard's path percent-encode set:
    controls, space, `"<>`{}` and non-ASCII, as UTF-8; `%` and `/` kept), and also `?` and `#`, so that a segment
    never ends the path."""
    return _UNSAFE.sub(lambda m: _encode(m.group(0)), segment)


_UNSAFE = re.compile(r'[^\x21-\x7e]+|[ "#<>?`{}]')


def _encode(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


def transport_error(exc: httpx.HTTPError, ep: Endpoint, method: str | Call, path: str = "", tries: int = 1,
                    hint: str = UNREACHABLE) -> ForkdError:
    """A request that got no answer: Unavailable (cannot connect; `hint` says how to get a daemon) or Timeout,
    naming the daemon. `method` may be the Call itself."""
    import httpx

    if isinstance(method, Call):
        method, path = method.method, method.path
    where = f"{method} {ep.where}{path}"
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return Timeout(f"{where}: the daemon did not answer in time ({type(exc).__name__})",
                       hint="the operation may still be running on the daemon; check it (e.g. 'forkd ls' or "
                            "'forkd snapshot ls'), or raise the client's timeout")
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return Unavailable(f"the forkd daemon at {ep.where} has a TLS certificate this client does not trust: {exc}",
                           hint="set FORKD_CA to the PEM file of the daemon's certificate or its CA")
    if isinstance(exc, httpx.TransportError):
        before = f"; tried before it: {'; '.join(ep.tried)}" if ep.tried else ""
        return Unavailable(f"cannot reach the forkd daemon at {ep.where} ({tries} attempt(s)): "
                           f"{exc or type(exc).__name__}{before}", hint=hint)
    return ForkdError(f"{where} failed: {exc}")


def answer(call: Call, r: httpx.Response) -> Any:
    """The result of a read answer: its error kind raised for a status >= 400, else the bytes or parsed JSON."""
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
    return data if call.parse is None else call.parse(data)


def _headers(ep: Endpoint) -> dict[str, str]:
    return {"Authorization": f"Bearer {ep.token}"} if ep.token else {}


def tls_verify(ep: Endpoint) -> Any:
    ca = os.environ.get("FORKD_CA")
    if not ca or ep.socket is not None:
        return True
    if not Path(ca).is_file():
        raise InvalidInput(f"FORKD_CA={ca!r} is not a file", hint="point FORKD_CA at a PEM bundle, or unset it")
    import ssl

    return ssl.create_default_context(cafile=ca)


class _Sender:
    """What both senders share: the endpoint, the retry policy, and the hint of an unreachable daemon."""

    unreachable_hint = UNREACHABLE  # the runtime's front door says how to run without a daemon instead
    _client, _transport = "Client", "HTTPTransport"  # httpx's, imported when a sender is made

    def __init__(self, endpoint: Endpoint, timeout: float = 600.0, retry: Retry | None = None):
        import httpx

        self.endpoint, self.retry = endpoint, retry or Retry()
        transport = getattr(httpx, self._transport)(uds=endpoint.socket) if endpoint.socket else None
        self._http = getattr(httpx, self._client)(base_url=endpoint.base_url, transport=transport,
                                                  headers=_headers(endpoint), timeout=timeout,
                                                  verify=tls_verify(endpoint))

    def _request(self, call: Call) -> httpx.Request:
        return self._http.build_request(call.method, call.path, **call.kwargs())

    def _retry_or_raise(self, exc: httpx.HTTPError, call: Call, attempt: int) -> None:
        """Returns when `call` may be sent again after `exc`; else raises its error."""
        if not self.retry.again(attempt, call.method, exc, None):
            raise transport_error(exc, self.endpoint, call, tries=attempt + 1, hint=self.unreachable_hint) from exc

    def _done(self, call: Call, r: httpx.Response, attempt: int) -> bool:
        return not self.retry.again(attempt, call.method, None, r.status_code)


class SyncHttp(_Sender):
    """Sends Calls synchronously to one Endpoint, retrying as `retry` says."""

    def _open(self, call: Call, stream: bool) -> httpx.Response:
        import httpx

        attempt = 0
        while True:
            try:
                r = self._http.send(self._request(call), stream=stream)
            except httpx.HTTPError as exc:
                self._retry_or_raise(exc, call, attempt)
            else:
                if self._done(call, r, attempt):
                    return r
                r.close()
            time.sleep(self.retry.wait(attempt))
            attempt += 1

    def _send(self, call: Call) -> Any:
        return answer(call, self._open(call, stream=False))

    @contextlib.contextmanager
    def stream(self, call: Call) -> Iterator[httpx.Response]:
        """A streamed answer, read inside the block (`iter_lines`, `iter_bytes`); a status >= 400 is raised as
        its error kind, a transport error while reading as Timeout/Unavailable."""
        import httpx

        r = self._open(call, stream=True)
        try:
            if r.status_code >= 400:
                r.read()
                answer(call, r)
            yield r
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.endpoint, call, hint=self.unreachable_hint) from exc
        finally:
            r.close()

    def close(self) -> None:
        self._http.close()


class AsyncHttp(_Sender):
    """Sends Calls as coroutines to one Endpoint, retrying as `retry` says."""

    _client, _transport = "AsyncClient", "AsyncHTTPTransport"

    async def _open(self, call: Call, stream: bool) -> httpx.Response:
        import asyncio  # here: a synchronous caller (the CLI) need not load it

        import httpx

        attempt = 0
        while True:
            try:
                r = await self._http.send(self._request(call), stream=stream)
            except httpx.HTTPError as exc:
                self._retry_or_raise(exc, call, attempt)
            else:
                if self._done(call, r, attempt):
                    return r
                await r.aclose()
            await asyncio.sleep(self.retry.wait(attempt))
            attempt += 1

    async def _send(self, call: Call) -> Any:
        return answer(call, await self._open(call, stream=False))

    @contextlib.asynccontextmanager
    async def stream(self, call: Call) -> AsyncIterator[httpx.Response]:
        """As SyncHttp.stream, with `aiter_lines`, `aiter_bytes`."""
        import httpx

        r = await self._open(call, stream=True)
        try:
            if r.status_code >= 400:
                await r.aread()
                answer(call, r)
            yield r
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.endpoint, call, hint=self.unreachable_hint) from exc
        finally:
            await r.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
