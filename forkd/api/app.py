"""The daemon's HTTP API (FastAPI), served on a 0600 unix socket by `forkd serve` (and on TCP with a bearer token,
see forkd.api.auth; every request passes forkd.api.audit.Gate first). It parses requests, calls
forkd.reconciler.control and the core and returns JSON; errors are problem details (application/problem+json)
with the status code of their kind.

Routes: the upstream-compatible `/v1/snapshots`, `/v1/sandboxes` and ours (`/v1/pools`..., files) are in
routes_v1.py; the routes of forkd's other CLI verbs (snapshots, children, gc, doctor, packs) in routes_forkd.py;
the declarative routes the CLI uses (apply, diff, objects, claim, wait) are here."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from forkd import __version__
from forkd.api.audit import Denials, Gate
from forkd.api.guestio import RETRY_AFTER, GuestIO
from forkd.api.metrics import Metrics
from forkd.api.routes_files import build_files_router
from forkd.api.routes_forkd import build_forkd_router
from forkd.api.routes_ports import build_ports_router
from forkd.api.routes_process import build_process_router
from forkd.api.routes_v1 import build_router
from forkd.base.errors import Busy, ForkdError, InvalidInput, NotFound
from forkd.base.settings import settings
from forkd.client.local import LocalBackend
from forkd.core.audit import AuditLog
from forkd.core.ports import PortGrants
from forkd.reconciler.control import Control
from forkd.spec.models import MODELS, to_document

PROBLEM = "application/problem+json"


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


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")  # unknown fields: 422 naming them

    document: dict[str, Any]
    source: str | None = None


class ApplyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # unknown fields: 422 naming them

    items: list[Item]
    applyset: str
    prune: bool = False
    dry_run: bool = False
    manager: str = Field("cli", pattern=r"^[a-z][a-z0-9-]{0,30}$")  # recorded as forkd.dev/managed-by
    force: bool = False  # take over objects another manager applied


class DiffRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # unknown fields: 422 naming them

    items: list[Item]


class WaitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # unknown fields: 422 naming them

    targets: list[tuple[str, str]]
    timeout: float = Field(300, gt=0, le=3600)


def _objs(items: list[Item]):
    out = []
    for it in items:
        kind = it.document.get("kind")
        if kind not in MODELS:
            raise InvalidInput(f"unknown kind {kind!r}")
        out.append((MODELS[kind].model_validate(it.document), it.source or "api"))
    return out


def create_app(control: Control, token: str | None = None, audit: AuditLog | None = None,
               metrics: Metrics | None = None, hosts: frozenset[str] | None = None,
               denials: Denials | None = None) -> FastAPI:
    """`token`: required on requests that came through the TCP listener (see auth.TagTransport; without one, TCP
    requests are refused); `hosts`: the Host names TCP requests may carry (auth.allowed_hosts); `audit`: where
    mutating calls are recorded (default $FORKD_HOME/audit.log); `denials`: counts refused unauthenticated
    requests (app.state.denials; flush it at shutdown)."""
    app = FastAPI(title="forkd", version=__version__,
                  description="forkd daemon API: upstream-compatible /v1 snapshots and sandboxes, plus pools, "
                              "claim, files and the declarative objects.")
    metrics = metrics or Metrics(control)
    audit = audit or AuditLog(control.rt.layout.home)
    denials = denials or Denials(audit, settings().audit_denied_interval)
    app.state.metrics, app.state.audit, app.state.control, app.state.denials = metrics, audit, control, denials
    gate = app.state.guestio = GuestIO()  # calls into guests: a pool of their own, bounded per child and client
    app.add_middleware(Gate, token=token, audit=audit, metrics=metrics, hosts=hosts, denials=denials)

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

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> JSONResponse:
        metrics.errors.labels(type(exc).__name__, "500").inc()
        return problem(500, "InternalError", f"{type(exc).__name__}: {exc}")

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

    app.include_router(build_router(control, metrics, gate))
    app.include_router(build_forkd_router(LocalBackend(control)))
    app.include_router(build_process_router(control.rt, gate))
    app.include_router(build_files_router(control, gate))
    app.include_router(build_ports_router(control, PortGrants()))

    @app.post("/v1/apply")
    def apply(req: ApplyRequest) -> dict:
        changes = control.apply(_objs(req.items), req.applyset, prune=req.prune, dry_run=req.dry_run,
                                manager=req.manager, force=req.force)
        return {"changes": [c.__dict__ for c in changes]}

    @app.post("/v1/diff")
    def diff(req: DiffRequest) -> dict:
        return {"diffs": control.diff(_objs(req.items))}

    @app.get("/v1/objects/{kind}")
    def list_objects(kind: str) -> dict:
        return {"items": [to_document(o) for o in control.get(_kind(kind))]}

    @app.get("/v1/objects/{kind}/{name}")
    def get_object(kind: str, name: str) -> dict:
        return {"items": [to_document(o) for o in control.get(_kind(kind), name)]}

    @app.get("/v1/objects/{kind}/{name}/describe")
    def describe(kind: str, name: str) -> dict:
        return control.describe(_kind(kind), name)

    @app.delete("/v1/objects/{kind}/{name}")
    def delete(kind: str, name: str) -> dict:
        control.delete(_kind(kind), name)
        return {"deleted": f"{kind}/{name}"}

    @app.post("/v1/wait")
    def wait(req: WaitRequest) -> dict:
        deadline = time.monotonic() + req.timeout
        targets = [tuple(t) for t in req.targets]
        while True:  # the daemon's own loop does the work; this only watches statuses
            ok, problems = control.reconciler.converged(targets)
            if ok or problems or time.monotonic() > deadline:
                if not ok and not problems:
                    problems = [f"timed out after {req.timeout:.0f}s"]
                return {"ok": ok, "problems": problems}
            time.sleep(0.2)

    document_problems(app)
    return app


def _kind(kind: str) -> str:
    if kind not in MODELS:
        raise NotFound(f"unknown kind {kind!r}", hint=f"one of {', '.join(MODELS)}")
    return kind
