"""The CLI's door to a running daemon: find it and call it with the standard library alone.

Every verb reaches the daemon through here: the streams (exec, logs) with `Daemon.events`, the rest through
`backend()`, forkd.client's RemoteBackend sending over `Sender` (this module's HTTP/1.1, forkd.cli.http1) instead of
the SDK's httpx client, so a verb starts without pydantic (forkd.base.settings) or httpx unless its own request or
answer is a model.
The variables that locate the daemon are read raw (`RAW`; declared and documented in forkd.base.settings); a value
that is not unambiguous as written is left to settings(), which parses (or refuses) them all. Failures are the
kinds of forkd.base.errors, as from every other client.
"""

from __future__ import annotations

import base64
import json
import os
from typing import TYPE_CHECKING, Any

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound, Timeout, Unavailable

if TYPE_CHECKING:
    from collections.abc import Iterator

RAW = {"url": "FORKD_URL", "token": "FORKD_TOKEN", "home": "FORKD_HOME", "no_daemon": "FORKD_NO_DAEMON",
       "ca": "FORKD_CA", "daemon_socket": "FORKD_DAEMON_SOCKET"}
DEFAULT_HOME = "/var/lib/forkd"  # Settings.home's default
KEEPALIVE = 20.0  # the daemon's keepalive interval on a stream; three missed ones end it
UNREACHABLE = ("start it with 'forkd serve', or fix FORKD_URL / FORKD_DAEMON_SOCKET; FORKD_NO_DAEMON=1 runs "
               "in-process")
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_KINDS = {400: InvalidInput, 401: InvalidInput, 403: InvalidInput, 404: NotFound, 408: Timeout, 409: Conflict,
          422: InvalidInput, 503: Unavailable, 504: Timeout}


def raw_env(name: str) -> str | None:
    """A FORKD_* variable as written (declared in forkd.base.settings), None when unset or blank."""
    value = os.environ.get(name, "")
    return value if value.strip() else None


def light_settings() -> dict | None:
    """The locating variables as written, or None when one needs settings() to parse it."""
    vals = {k: raw_env(name) for k, name in RAW.items()}
    flag = (vals["no_daemon"] or "0").strip().lower()
    if flag not in _BOOLS or (vals["url"] and not vals["url"].startswith(("http://", "https://"))):
        return None
    return dict(vals, no_daemon=_BOOLS[flag], home=vals["home"] or DEFAULT_HOME)


def full_settings() -> dict:
    """The same values, parsed by forkd.base.settings (the slow path, for values light_settings leaves)."""
    from forkd.base.settings import settings

    s = settings()
    return {"url": s.url, "token": s.token_value, "home": str(s.home), "no_daemon": s.no_daemon,
            "ca": str(s.ca) if s.ca else None, "daemon_socket": str(s.daemon_socket) if s.daemon_socket else None}


class Daemon:
    """A daemon at `url` (TCP, bearer `token`, `ca` for https) or on the unix socket `sock`."""

    def __init__(self, url: str | None, sock: str | None, token: str | None, ca: str | None):
        self.url, self.sock, self.token, self.ca = url, sock, token, ca

    @classmethod
    def find(cls) -> Daemon | None:
        """The daemon the environment names (FORKD_URL, FORKD_DAEMON_SOCKET: that one or an error), else the one
        answering on $FORKD_HOME/forkd.sock, else None (the verb then runs in-process)."""
        s = light_settings() or full_settings()
        if s["no_daemon"]:
            return None
        if s["url"]:
            return cls(s["url"].rstrip("/"), None, s["token"], s["ca"])
        if s["daemon_socket"]:
            return cls(None, s["daemon_socket"], s["token"], s["ca"])
        sock = os.path.join(s["home"], "forkd.sock")
        if not os.path.exists(sock):
            return None
        d = cls(None, sock, s["token"], s["ca"])
        try:
            d.request("GET", "/healthz", timeout=2.0)
        except ForkdError:
            return None  # a stale socket file left by a killed daemon
        return d

    def _conn(self, timeout: float) -> Any:
        from urllib.parse import urlsplit

        from forkd.cli.http1 import Connection

        if self.sock:
            return Connection(timeout, unix=self.sock)
        u = urlsplit(self.url)
        if u.scheme == "https":
            import ssl

            ctx = ssl.create_default_context(cafile=self.ca)
            return Connection(timeout, host=u.hostname, port=u.port or 443, tls=ctx)
        return Connection(timeout, host=u.hostname, port=u.port or 80)

    def send(self, method: str, path: str, body: Any = None, timeout: float = 60.0, params: dict | None = None,
             content: bytes | None = None, quoted: bool = False) -> Any:
        """Send one request (a JSON `body`, or raw `content`); the open connection and its answer's head. An answer
        of 400 or more is raised as its kind (forkd_client.errors.api_error, as the SDK's client raises it); a
        daemon that cannot be reached, Unavailable (`refused` set when no connection was made: safe to send
        again); one that does not answer in time, Timeout. `quoted`: `path` is already percent-encoded."""
        from urllib.parse import quote, urlencode, urlsplit

        prefix = urlsplit(self.url).path.rstrip("/") if self.url else ""
        target = prefix + (path if quoted else quote(path)) + (f"?{urlencode(params, doseq=True)}" if params else "")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        data = json.dumps(body) if body is not None else None
        if content is not None:
            headers, data = {"Content-Type": "application/octet-stream"}, content
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._conn(timeout)
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise self._unreached(exc, f"{method} {self.where}{path}") from None
        if resp.status >= 400:
            try:
                raise self._problem(resp, f"{self.where}{path}")
            finally:
                conn.close()
        return conn, resp

    @property
    def where(self) -> str:
        return self.sock or self.url or ""

    def _unreached(self, exc: OSError, what: str) -> ForkdError:
        if isinstance(exc, TimeoutError):
            return Timeout(f"{what}: the daemon did not answer in time",
                           hint="the operation may still be running on the daemon; check it (e.g. 'forkd ls' or "
                                "'forkd snapshots'), or raise the client's timeout")
        err = Unavailable(f"cannot reach the forkd daemon at {self.where}: {exc}", UNREACHABLE)
        err.refused = isinstance(exc, ConnectionRefusedError | FileNotFoundError)  # nothing was sent
        return err

    @staticmethod
    def _problem(resp: Any, url: str) -> ForkdError:
        from forkd_client.errors import api_error

        raw = resp.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        return api_error(resp.status, body, url)

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60.0,
                params: dict | None = None) -> Any:
        """One call; its JSON answer (None when empty)."""
        conn, resp = self.send(method, path, body, timeout, params)
        try:
            data = resp.read()
        finally:
            conn.close()
        return json.loads(data) if data else None

    def events(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Iterator[dict]:
        """A stream of JSON lines; `data` fields (base64) decoded to bytes."""
        conn, resp = self.send(method, path, body, KEEPALIVE * 3, params)
        try:
            while line := resp.readline():
                if line.strip():
                    ev = json.loads(line)
                    if isinstance(ev.get("data"), str):
                        ev["data"] = base64.b64decode(ev["data"])
                    yield ev
        except OSError as exc:
            raise Unavailable(f"the stream from the daemon broke: {exc}") from None
        finally:
            conn.close()


class Sender:
    """Sends the SDK's Calls (forkd_client.http.Call) through a Daemon, retrying as the SDK's senders do (a
    connection refused, whatever the method; a 503 for an idempotent one): the transport of the CLI's
    RemoteBackend, with the standard library alone."""

    def __init__(self, d: Daemon, timeout: float = 600.0):
        from forkd_client.http import Retry

        self.d, self.timeout, self.retry = d, timeout, Retry()

    def _send(self, call: Any) -> Any:
        import time

        attempt = 0
        while True:
            try:
                conn, resp = self.d.send(call.method, call.path, call.json, call.timeout or self.timeout,
                                         call.params, call.content, quoted=True)
            except Unavailable as exc:
                if not getattr(exc, "refused", False) and not self.retry.again(attempt, call.method, None,
                                                                                exc.status):
                    raise
                if attempt + 1 >= self.retry.attempts:
                    raise
            else:
                try:
                    data = resp.read()
                finally:
                    conn.close()
                if call.raw:
                    return data
                got = json.loads(data) if data else None
                return got if got is None or call.parse is None else call.parse(got)
            time.sleep(self.retry.wait(attempt))
            attempt += 1


def backend() -> Any:
    """The daemon's RemoteBackend over the CLI's own transport (Sender) when one answers, else forkd.client's
    backend() (in-process, its logging set up: forkd.cli.config.QUIET_VERBS). Finding the daemon needs neither
    the settings model nor httpx when the environment is plain (light_settings)."""
    d = Daemon.find()
    if d is None:
        from forkd.cli.config import setup_logging
        from forkd.client import backend as in_process

        setup_logging()
        return in_process()
    from forkd.client.http import Endpoint
    from forkd.client.remote import RemoteBackend

    endpoint = Endpoint(d.url or "http://forkd", d.sock, d.token)
    return RemoteBackend(endpoint=endpoint, http=Sender(d), plain=True)
