"""The daemon's HTTP API (FastAPI), served on a 0600 unix socket by `forkd serve`. It parses requests, calls
forkd.reconciler.control and returns JSON; errors are problem details with the status code of their kind."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound
from forkd.client.backends import child_view
from forkd.reconciler.control import Control
from forkd.spec.models import MODELS, to_document

STATUS = {InvalidInput: 400, NotFound: 404, Conflict: 409}


class Item(BaseModel):
    document: dict[str, Any]
    source: str | None = None


class ApplyRequest(BaseModel):
    items: list[Item]
    applyset: str
    prune: bool = False
    dry_run: bool = False
    manager: str = Field("cli", pattern=r"^[a-z][a-z0-9-]{0,30}$")  # recorded as forkd.dev/managed-by
    force: bool = False  # take over objects another manager applied


class DiffRequest(BaseModel):
    items: list[Item]


class ClaimRequest(BaseModel):
    n: int = Field(1, ge=1, le=1000)


class WaitRequest(BaseModel):
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


def create_app(control: Control) -> FastAPI:
    app = FastAPI(title="forkd", version="v1")

    @app.exception_handler(ForkdError)
    async def forkd_error(_: Request, exc: ForkdError) -> JSONResponse:
        code = next((c for t, c in STATUS.items() if isinstance(exc, t)), 500)
        return JSONResponse({"title": type(exc).__name__, "status": code, "detail": exc.message, "hint": exc.hint},
                            status_code=code, media_type="application/problem+json")

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

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

    @app.post("/v1/pools/{name}/claim")
    def claim(name: str, req: ClaimRequest) -> dict:
        t0 = time.perf_counter()
        recs = control.claim(name, req.n)
        return {"children": [child_view(r) for r in recs], "claim_ms": (time.perf_counter() - t0) * 1000.0}

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

    return app


def _kind(kind: str) -> str:
    if kind not in MODELS:
        raise NotFound(f"unknown kind {kind!r}", hint=f"one of {', '.join(MODELS)}")
    return kind
