"""The gate every request passes: bearer-token check for requests from the TCP listener, request metrics, and one
audit line (forkd.core.audit, hash-chained and fsynced) per mutating call, denied ones included."""

from __future__ import annotations

import json
import time

from starlette.concurrency import run_in_threadpool

from forkd.api.auth import OPEN_PATHS, TRANSPORT_KEY, actor_of, bearer_ok
from forkd.core.audit import AuditLog

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_ONLY_POSTS = frozenset({"/v1/diff", "/v1/wait"})


class Gate:
    def __init__(self, app, token: str | None, audit: AuditLog | None, metrics=None):
        self.app, self.token, self.audit, self.metrics = app, token, audit, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        method, path = scope["method"], scope["path"]
        actor = actor_of(scope, self.token)
        status = {"code": 500}

        async def send_(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if (scope.get(TRANSPORT_KEY) == "tcp" and self.token and path not in OPEN_PATHS
                    and not bearer_ok(_header(scope, b"authorization"), self.token)):
                actor = "tcp:unauthenticated"
                await _deny(send_)
                if self.metrics:
                    self.metrics.errors.labels("Unauthorized", "401").inc()
            else:
                scope.setdefault("state", {})["actor"] = actor
                await self.app(scope, receive, send_)
        finally:
            await self._record(scope, method, path, actor, status["code"], t0)

    async def _record(self, scope, method: str, path: str, actor: str, code: int, t0: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or path
        if self.metrics:
            self.metrics.requests.labels(method, template if route else "unmatched", str(code)).inc()
        if self.audit and method in MUTATING and path not in READ_ONLY_POSTS:
            params = scope.get("path_params") or {}
            target = "/".join(str(v) for v in params.values()) or path
            await run_in_threadpool(
                self.audit.append, actor, f"{method} {template}", target,
                "ok" if code < 400 else "denied" if code in (401, 403) else "error",
                (time.perf_counter() - t0) * 1000.0, status=code, via=scope.get(TRANSPORT_KEY, "unix"))


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def _deny(send) -> None:
    body = json.dumps({"type": "about:blank", "title": "Unauthorized", "status": 401,
                       "detail": "missing or wrong bearer token", "error": "missing or wrong bearer token",
                       "hint": "send 'Authorization: Bearer <token>' (FORKD_TOKEN for the CLI and SDKs)"}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/problem+json"), (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
