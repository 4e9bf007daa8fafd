"""The declarative verbs over many objects at once: apply (with its applyset and prune), diff and wait. The objects
are the reconciler's Control, held by the service (forkd.service.Service.control); one object's routes are its
kind's collection (forkd.api.routes_kinds, `/v1/pools/{name}`...). `/v1/objects/{kind}[/{name}[/describe]]`
are deprecated aliases of those: the same Control calls, kept for clients of the previous release."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from forkd.base.errors import InvalidInput, NotFound
from forkd.service import Service
from forkd.spec.models import MODELS, to_document


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


def build_objects_router(s: Service) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/apply")
    def apply(req: ApplyRequest) -> dict:
        changes = s.control.apply(_objs(req.items), req.applyset, prune=req.prune, dry_run=req.dry_run,
                                manager=req.manager, force=req.force)
        return {"changes": [c.__dict__ for c in changes]}

    @r.post("/v1/diff")
    def diff(req: DiffRequest) -> dict:
        return {"diffs": s.control.diff(_objs(req.items))}

    @r.get("/v1/objects/{kind}", deprecated=True, tags=["deprecated"])
    def list_objects(kind: str) -> dict:
        return {"items": [to_document(o) for o in s.control.get(_kind(kind))]}

    @r.get("/v1/objects/{kind}/{name}", deprecated=True, tags=["deprecated"])
    def get_object(kind: str, name: str) -> dict:
        return {"items": [to_document(o) for o in s.control.get(_kind(kind), name)]}

    @r.get("/v1/objects/{kind}/{name}/describe", deprecated=True, tags=["deprecated"])
    def describe(kind: str, name: str) -> dict:
        return s.control.describe(_kind(kind), name)

    @r.delete("/v1/objects/{kind}/{name}", deprecated=True, tags=["deprecated"])
    def delete(kind: str, name: str) -> dict:
        s.control.delete(_kind(kind), name)
        return {"deleted": f"{kind}/{name}"}

    @r.post("/v1/wait")
    def wait(req: WaitRequest) -> dict:
        deadline = time.monotonic() + req.timeout
        targets = [tuple(t) for t in req.targets]
        while True:  # the daemon's own loop does the work; this only watches statuses
            ok, problems = s.control.reconciler.converged(targets)
            if ok or problems or time.monotonic() > deadline:
                if not ok and not problems:
                    problems = [f"timed out after {req.timeout:.0f}s"]
                return {"ok": ok, "problems": problems}
            time.sleep(0.2)

    return r


def _kind(kind: str) -> str:
    if kind not in MODELS:
        raise NotFound(f"unknown kind {kind!r}", hint=f"one of {', '.join(MODELS)}")
    return kind
