"""The CLI's light door to a running daemon: find it and call it with the standard library alone.

A verb that only reads (ls, snapshots) or streams (exec, logs) goes through here, so it starts without pydantic
(forkd.base.settings), httpx or the SDK's models; every other verb goes through forkd.client's `backend()`.
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

    from forkd.service.listing import ChildView, SnapshotView

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

    def _send(self, method: str, path: str, body: Any, timeout: float, params: dict | None = None) -> Any:
        from urllib.parse import quote, urlencode, urlsplit

        prefix = urlsplit(self.url).path.rstrip("/") if self.url else ""
        target = prefix + quote(path) + (f"?{urlencode(params, doseq=True)}" if params else "")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._conn(timeout)
        try:
            conn.request(method, target, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise Unavailable(f"cannot reach the forkd daemon at {self.sock or self.url}: {exc}", UNREACHABLE) from None
        if resp.status >= 400:
            raise self._problem(resp)
        return conn, resp

    @staticmethod
    def _problem(resp: Any) -> ForkdError:
        raw = resp.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"detail": raw.decode("utf-8", "replace")}
        if not isinstance(body, dict):
            body = {"detail": str(body)}
        kind = _KINDS.get(resp.status, ForkdError)
        return kind(str(body.get("detail") or f"HTTP {resp.status}"), body.get("hint"), status=resp.status, body=body)

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60.0,
                params: dict | None = None) -> Any:
        """One call; its JSON answer (None when empty)."""
        conn, resp = self._send(method, path, body, timeout, params)
        try:
            data = resp.read()
        finally:
            conn.close()
        return json.loads(data) if data else None

    def events(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Iterator[dict]:
        """A stream of JSON lines; `data` fields (base64) decoded to bytes."""
        conn, resp = self._send(method, path, body, KEEPALIVE * 3, params)
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


class Reads:
    """The read verbs the CLI sends through the light client (the same answers as RemoteBackend's)."""

    def __init__(self, d: Daemon):
        self.d = d
        self.is_local = d.sock is not None  # a TCP daemon's agent sockets are on its host, not ours

    def children(self, labels: list[str] | None = None) -> list[ChildView]:
        from forkd.service.listing import ChildView  # a dataclass: exec and logs need none

        got = self.d.request("GET", "/v1/children", params={"label": labels} if labels else None)
        views = [ChildView.from_json(v) for v in got]
        return views if self.is_local else [v.elsewhere() for v in views]

    def snapshots(self) -> list[SnapshotView]:
        from forkd.service.listing import SnapshotView  # a dataclass, as children's

        return [SnapshotView.from_json(s) for s in self.d.request("GET", "/v1/snapshots")]


def reads() -> Any:
    """The light client when a daemon answers, else forkd.client's backend() (in-process)."""
    d = Daemon.find()
    if d is not None:
        return Reads(d)
    from forkd.cli.config import setup_logging
    from forkd.client import backend

    setup_logging()  # in-process: the runtime logs (forkd.cli.config.QUIET_VERBS)
    return backend()
