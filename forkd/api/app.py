"""The daemon's HTTP API (FastAPI), served on a 0600 unix socket by `forkd serve` (and on TCP with a bearer token,
see forkd.api.auth; every request passes forkd.api.audit.Gate first). Its routes parse requests, call the
one service (forkd.service.Service: the verbs LocalBackend calls in-process) and return JSON; errors are problem
details (application/problem+json) with the status code of their kind.

One route table per resource: routes_snapshots (`/v1/snapshots`, upstream's URLs among them, and `/v1/images`;
the previous release's `/v1/manifests` and `/v1/build/*` as deprecated aliases), routes_children (the native
`/v1/children` and host verbs), routes_sandboxes (the compatibility layer `/v1/sandboxes`: upstream's and the
SDKs', an adapter over the same service verbs), routes_kinds
(`/v1/pools`... and claim), routes_objects (apply, diff, wait), routes_process, routes_files, routes_ports. The
calls on one child are one handler under both `/v1/children/{id}/` and `/v1/sandboxes/{id}/`. docs/rest.md is
generated from these tables (forkd.api.reference)."""

from __future__ import annotations

import errno
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from forkd import __version__
from forkd.api.audit import Denials, Gate
from forkd.api.guestio import RETRY_AFTER, GuestIO
from forkd.api.metrics import Metrics
from forkd.api.routes_children import build_children_router, child_calls
from forkd.api.routes_files import build_files_router
from forkd.api.routes_jobs import build_jobs_router
from forkd.api.routes_kinds import build_kinds_router
from forkd.api.routes_objects import build_objects_router
from forkd.api.routes_ports import build_ports_router
from forkd.api.routes_process import build_process_router
from forkd.api.routes_sandboxes import build_sandbox_router
from forkd.api.routes_snapshots import build_snapshot_router
from forkd.base.errors import Busy, ForkdError
from forkd.base.settings import settings
from forkd.core.audit import AuditLog
from forkd.reconciler.control import Control
from forkd.service import Service

PROBLEM = "application/problem+json"
log = logging.getLogger("forkd.api")


def problem(status: int, title: str, detail: str, hint: str | None = None, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "error": detail}
    if hint:
        body["hint"] = hint
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM)


PROBLEM_SCHEMA = {"type": "object", "required": ["type", "title", "status", "detail"],
                  "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                 "status": {"type": "integer"}, "detail": {"type": "string"},
                                 "error": {"type": "string"}, "hint": {"type": "string"}},
                  "additionalProperties": True}
PROBLEM_CODES = {"400": "bad input", "401": "missing or wrong bearer token", "404": "not found",
                 "405": "method not allowed", "409": "conflict: not ready, in use, or owned by another manager",
                 "415": "a body that is not application/json", "421": "a Host header that does not name this daemon",
                 "422": "invalid request body or document", "500": "internal error", "501": "not implemented",
                 "503": "unavailable", "504": "timed out"}


def document_problems(app: FastAPI) -> None:
    """Every route can answer with these application/problem+json errors: say so in /openapi.json."""
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        spec = base()
        for ops in spec.get("paths", {}).values():
            for op in ops.values():
                responses = op.setdefault("responses", {})
                for code, why in PROBLEM_CODES.items():
                    responses[code] = {"description": why,
                                       "content": {PROBLEM: {"schema": PROBLEM_SCHEMA}}}
        app.openapi_schema = spec
        return spec

    app.openapi = openapi


def create_app(service: Service | Control, token: str | None = None, audit: AuditLog | None = None,
               metrics: Metrics | None = None, hosts: frozenset[str] | None = None,
               denials: Denials | None = None) -> FastAPI:
    """The daemon's app over `service` (a Control is wrapped in a Service of its own). `token`: required on
    requests that came through the TCP listener (see auth.TagTransport; without one, TCP requests are refused);
    `hosts`: the Host names TCP requests may carry (auth.allowed_hosts); `audit`: where mutating calls are
    recorded (default $FORKD_HOME/audit.log); `denials`: counts refused unauthenticated requests
    (app.state.denials; flush it at shutdown)."""
    s = service if isinstance(service, Service) else Service(service)
    app = FastAPI(title="forkd", version=__version__,
                  description="forkd daemon API: upstream-compatible /v1 snapshots and sandboxes, plus pools, "
                              "claim, files and the declarative objects.")
    metrics = metrics or Metrics(s.control)
    audit = audit or AuditLog(s.rt.layout.home)
    denials = denials or Denials(audit, settings().audit_denied_interval)
    app.state.metrics, app.state.audit, app.state.control, app.state.denials = metrics, audit, s.control, denials
    app.state.service = s
    gate = app.state.guestio = GuestIO()  # calls into guests: a pool of their own, bounded per child and client
    app.add_middleware(Gate, token=token, audit=audit, metrics=metrics, hosts=hosts, denials=denials)
    _error_handlers(app, metrics)
    _status_routes(app, metrics)
    calls = call_routers(s, metrics, gate)
    for router in (build_snapshot_router(s), build_jobs_router(s), build_children_router(s), child_calls(*calls),
                   *calls, build_kinds_router(s), build_objects_router(s)):
        app.include_router(router)
    document_problems(app)
    return app


def call_routers(s: Service, metrics: Metrics, gate: GuestIO) -> list[APIRouter]:
    """The compatibility layer's route tables (`/v1/sandboxes` and the calls on one child under it)."""
    return [build_sandbox_router(s, metrics, gate), build_process_router(s, gate), build_files_router(s, gate),
            build_ports_router(s)]


def _error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every failure as application/problem+json with the status code of its kind, counted in the metrics."""
    @app.exception_handler(ForkdError)
    async def forkd_error(_: Request, exc: ForkdError) -> JSONResponse:
        code = exc.http_status
        metrics.errors.labels(type(exc).__name__, str(code)).inc()
        if isinstance(exc, Busy):
            resp = problem(code, type(exc).__name__, exc.message, exc.hint, retry_after=RETRY_AFTER)
            resp.headers["Retry-After"] = str(RETRY_AFTER)
            return resp
        return problem(code, type(exc).__name__, exc.message, exc.hint)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.errors.labels("RequestValidationError", "422").inc()
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": str(e.get("type"))}
                  for e in exc.errors()]
        # every way the first field failed (a union's branches: "none or internet; or {allow}: IPv6 ..."), at most 5
        parts = [e for e in errors if e["loc"][:2] == errors[0]["loc"][:2]][:5] if errors else []
        detail = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in parts)
        return problem(422, "InvalidRequest", detail or "invalid request", errors=errors)

    @app.exception_handler(ValidationError)
    async def invalid_document(_: Request, exc: ValidationError) -> JSONResponse:
        metrics.errors.labels("ValidationError", "422").inc()
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": str(e.get("type"))}
                  for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid document"}
        return problem(422, "InvalidDocument", f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}",
                       errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        metrics.errors.labels("HTTPException", str(exc.status_code)).inc()
        resp = problem(exc.status_code, "HTTPError", str(exc.detail))
        for k, v in (exc.headers or {}).items():
            resp.headers[k] = v
        if exc.status_code == 405:  # Starlette names only the first matching route's methods: name them all
            allowed = sorted({m for r in app.routes if getattr(r, "methods", None)
                              and r.matches(request.scope)[0] != Match.NONE for m in r.methods})
            resp.headers["Allow"] = ", ".join(allowed)
        return resp

    _failure_handlers(app, metrics)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _failure_handlers(app: FastAPI, metrics: Metrics) -> None:
    """A full filesystem, and everything else no handler above knows.

    A full filesystem is an answer (503), handled like a ForkdError. The catch-all is Starlette's last resort: it
    answers, then re-raises to the server, which logs the traceback and drops the connection at once. A client
    that already sent its next request on that kept-alive connection then sees it reset, so the catch-all's
    answer says `Connection: close`; an ENOSPC reaches it only from outside the routes (a middleware's write)."""
    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError) -> JSONResponse:
        if exc.errno not in NO_SPACE:
            raise exc  # to the catch-all
        log.warning("%s %s refused: %s", request.method, request.url.path, exc)
        metrics.errors.labels("Unavailable", "503").inc()
        return _no_space(exc, request.app.state.service.rt.layout.home)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            metrics.errors.labels("Unavailable", "503").inc()
            resp = _no_space(exc, request.app.state.service.rt.layout.home)
        else:
            metrics.errors.labels(type(exc).__name__, "500").inc()
            resp = problem(500, "InternalError", f"{type(exc).__name__}: {exc}")
        resp.headers["Connection"] = "close"
        return resp


def _no_space(exc: OSError, home) -> JSONResponse:
    """A write that found its filesystem full (or a quota spent): Unavailable, naming the file and the way out, not
    an internal error. What the request had written is its own to undo (each writer removes its temporaries)."""
    where = exc.filename or f"a filesystem forkd writes to ($FORKD_HOME {home}, or FORKD_SHM)"
    return problem(503, "Unavailable", f"{exc.strerror or 'No space left on device'}: {where}",
                   f"free space on the filesystem holding {where} (see 'df'), then retry")


def _status_routes(app: FastAPI, metrics: Metrics) -> None:
    @app.get("/healthz", tags=["status"])
    def healthz() -> dict:
        return {"ok": True}

    @app.get("/version", tags=["status"])
    def version() -> dict:
        return {"version": __version__, "api": "v1"}

    @app.get("/metrics", tags=["status"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    def metrics_() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
