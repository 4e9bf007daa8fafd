"""The gate every request passes, in this order:

1. scope type: HTTP (and the lifespan) only; a websocket or any other scope is refused, but for a WebSocket to a
   sandbox's port (under PORT_PREFIX: the Host check applies, its route checks the grant's token);
2. TCP: the Host header must name this daemon (421 otherwise: DNS rebinding), then the bearer token (401), except
   under PORT_PREFIX (a sandbox's port, whose route checks its own grant's token: forkd.api.routes_ports);
3. mutating methods: a body must be `application/json` (the raw file upload, a PUT: `application/octet-stream`
   or untyped), 415 otherwise: the CORS-simple types a web page may send without a preflight (text/plain, forms)
   never reach a route (a sandbox's port takes what its server takes);
4. request metrics, and one audit line (forkd.core.audit, hash-chained and fsynced) per mutating call.

Requests refused before anyone was authenticated (1, 2 and foreign peers on the unix socket) do not get a line
each, or anybody could grow the log and make the daemon fsync at will: `Denials` counts them and writes one
summary line per interval (FORKD_AUDIT_DENIED_INTERVAL, first refusal at once, before it is answered) and the rest
at shutdown. An append that fails does not fail the request (fail-open, README): it is logged at ERROR, and the
audit log names it in a `lost-entries` line at its next append that works (forkd.core.audit)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter

from starlette.concurrency import run_in_threadpool

from forkd.api.auth import OPEN_PATHS, PORT_PREFIX, TRANSPORT_KEY, actor_of, bearer_ok, host_ok
from forkd.api.scoped import SCOPE_KEY, allows, is_scoped, scoped_children
from forkd.core.audit import AuditError, AuditLog

log = logging.getLogger("forkd.audit")

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_ONLY_POSTS = frozenset({"/v1/diff", "/v1/wait"})
RAW_BODY = re.compile(r"^/v1/(sandboxes|children)/[^/]+/files(/content|/archive)?$")  # PUT: the body is the bytes
JSON_HINT = ("send the body as JSON with 'Content-Type: application/json' (a file upload: "
             "'Content-Type: application/octet-stream')")


class Denials:
    """Requests refused before authentication: counted by reason, written as summary lines (see module doc)."""

    def __init__(self, audit: AuditLog | None, interval: float = 60.0):
        self.audit, self.interval = audit, interval
        self._lock = threading.Lock()
        self._reasons: Counter[str] = Counter()
        self._since = 0.0
        self._next = 0.0

    def count(self, reason: str) -> dict | None:
        """Count one refusal; the batch to write when the interval is over (write it with `write`), else None."""
        with self._lock:
            now = time.monotonic()
            if not self._reasons:
                self._since = time.time()
            self._reasons[reason] += 1
            if now < self._next:
                return None
            self._next = now + self.interval
            return self._take()

    def _take(self) -> dict | None:
        if not self._reasons:
            return None
        batch = {"count": sum(self._reasons.values()), "reasons": dict(self._reasons), "since": self._since}
        self._reasons.clear()
        return batch

    def write(self, batch: dict | None) -> None:
        if batch and self.audit is not None:
            try:  # fail-open (README): the failure is logged and named by the next append that works
                self.audit.append("unauthenticated", "refused", f"{batch['count']} requests", "denied", 0.0, **batch)
            except AuditError as exc:
                log.error("refused requests not recorded in the audit log: %s", exc)

    def record(self, reason: str) -> None:
        """Count and, when due, write at once (for callers outside the event loop's request path)."""
        self.write(self.count(reason))

    def flush(self) -> None:
        with self._lock:
            batch = self._take()
        self.write(batch)


class Gate:
    def __init__(self, app, token: str | None, audit: AuditLog | None, metrics=None,
                 hosts: frozenset[str] | None = None, denials: Denials | None = None):
        self.app, self.token, self.audit, self.metrics, self.hosts = app, token, audit, metrics, hosts
        self.denials = denials if denials is not None else Denials(audit)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket" and scope["path"].startswith(PORT_PREFIX):
            refused = self._before_auth(scope, scope["path"])  # the Host check; the route checks the grant
            if refused is None:
                await self.app(scope, receive, send)
                return
        if scope["type"] != "http":
            await self._refuse_scope(scope, send)
            return
        t0 = time.perf_counter()
        method, path = scope["method"], scope["path"]
        refused = self._before_auth(scope, path)
        if refused is not None:
            code, title, detail, hint = refused
            await self._deny(f"{code} {title}", method, code)  # counted (and written when due) before answering
            await _problem(send, code, title, detail, hint)
            return
        scoped = scope.get(SCOPE_KEY)
        actor = actor_of(scope, self.token) if scoped is None else "scoped:" + ",".join(sorted(scoped))
        status = {"code": 500}

        async def send_(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            bad_type = _content_type_problem(scope, method, path)
            if bad_type is not None:
                await _problem(send_, 415, "UnsupportedMediaType", bad_type, JSON_HINT)
            else:
                scope.setdefault("state", {})["actor"] = actor
                await self.app(scope, receive, send_)
        finally:
            await self._record(scope, method, path, actor, status["code"], t0)

    def _before_auth(self, scope, path: str) -> tuple[int, str, str, str] | None:
        """(status, title, detail, hint) when a TCP request is refused before routing, else None."""
        if scope.get(TRANSPORT_KEY) != "tcp":
            return None
        if self.hosts is not None and not host_ok(scope, self.hosts):
            return (421, "MisdirectedRequest", "the Host header does not name this daemon",
                    "use the address the daemon is bound to, or start it with --allow-host NAME")
        if path in OPEN_PATHS or path.startswith(PORT_PREFIX):
            return None
        header = _header(scope, b"authorization")
        if is_scoped(header):  # a claim's token: only its children's routes (forkd.api.scoped)
            children = scoped_children(header, self.token, time.time())
            if children is not None and allows(scope["method"], path, children):
                scope[SCOPE_KEY] = children
                return None
            if children is not None:
                return (403, "Forbidden", f"this token is scoped to sandboxes {', '.join(sorted(children))}: "
                        f"{scope['method']} {path} is outside it", "use the daemon's bearer token for other calls")
        if not self.token or not bearer_ok(header, self.token):
            return (401, "Unauthorized", "missing or wrong bearer token",
                    "send 'Authorization: Bearer <token>' (FORKD_TOKEN for the CLI and SDKs)")
        return None

    async def _refuse_scope(self, scope, send) -> None:
        if scope["type"] == "websocket":  # closing before accept: the server answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008, "reason": "forkd serves no websocket"})
        await self._deny(f"{scope['type']} scope", scope["type"].upper(), 403)

    async def _deny(self, reason: str, method: str, code: int) -> None:
        if self.metrics:
            self.metrics.errors.labels("Refused", str(code)).inc()
            self.metrics.requests.labels(method, "unmatched", str(code)).inc()
        batch = self.denials.count(reason)
        if batch is not None:
            await run_in_threadpool(self.denials.write, batch)

    async def _record(self, scope, method: str, path: str, actor: str, code: int, t0: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or (PORT_PREFIX + "..." if path.startswith(PORT_PREFIX) else path)
        if self.metrics:
            self.metrics.requests.labels(method, template if route else "unmatched", str(code)).inc()
        if self.audit and method in MUTATING and path not in READ_ONLY_POSTS:
            params = {k: v for k, v in (scope.get("path_params") or {}).items() if k != "token"}  # never logged
            target = "/".join(str(v) for v in params.values()) or path
            try:  # fail-open (README): the failure is logged and named by the next append that works
                await run_in_threadpool(
                    self.audit.append, actor, f"{method} {template}", target,
                    "ok" if code < 400 else "denied" if code in (401, 403) else "error",
                    (time.perf_counter() - t0) * 1000.0, status=code, via=scope.get(TRANSPORT_KEY, "unix"))
            except AuditError as exc:
                log.error("%s %s by %s not recorded in the audit log: %s", method, path, actor, exc)


def _content_type_problem(scope, method: str, path: str) -> str | None:
    """Why a mutating request's body may not reach its route, or None (see module doc, point 3)."""
    if method not in MUTATING or path.startswith(PORT_PREFIX):
        return None
    ctype = _header(scope, b"content-type")
    raw = method == "PUT" and RAW_BODY.match(path) is not None
    if ctype is None and raw:  # upstream's clients upload untyped; a page cannot send a PUT without a preflight
        return None
    if ctype is None:
        length = _header(scope, b"content-length")
        has_body = _header(scope, b"transfer-encoding") is not None or (length or "0").strip() not in ("", "0")
        return f"{method} {path} has a body without a Content-Type" if has_body else None
    media = ctype.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    if media == "application/octet-stream" and raw:
        return None
    return f"{method} {path}: Content-Type {media or ctype!r} is not accepted"


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def _problem(send, status: int, title: str, detail: str, hint: str) -> None:
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail,
                       "error": detail, "hint": hint}).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
