"""forkd's declarative kinds as REST resources, their one native family (`/v1/parents`, `/v1/layers`, `/v1/pools`,
`/v1/branches`, `/v1/claims`: list, get, apply, put, delete, status, describe), a pool's claim and the node's
capacity. The objects are the
reconciler's Control, held by the service (forkd.service.Service.control)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import JSONResponse

from forkd.base.errors import InvalidInput
from forkd.reconciler.control import Control, resolve_kind
from forkd.reconciler.objects import key
from forkd.service import Service, wire
from forkd.spec.models import MODELS, PLURALS, to_document

KINDS = {plural: kind for kind, plural in PLURALS.items()}


def build_kinds_router(s: Service) -> APIRouter:
    r = APIRouter()
    for plural, kind in KINDS.items():
        _kind_routes(r, s.control, plural, kind)

    @r.post("/v1/pools/{name}/claim", tags=["pools"])
    def claim(name: str, req: wire.ClaimRequest | None = Body(None)) -> wire.ClaimResult:
        req = req or wire.ClaimRequest()
        t0 = time.perf_counter()
        views = s.claim(name, req.n, lifetime=req.lifetime_secs)
        dt = time.perf_counter() - t0  # forkd_claim_seconds: observed by control.claim (forkd.base.telemetry)
        return wire.ClaimResult(children=views, sandboxes=[wire.sandbox_info(v) for v in views],
                                claim_ms=dt * 1000.0)

    @r.get("/v1/node", tags=["status"])
    def node() -> dict:
        """This node's capacity for placement: memory available to children, running children (per pool)."""
        return s.capacity()

    return r


def _kind_routes(r: APIRouter, control: Control, plural: str, kind: str) -> None:
    tag = [plural]

    def listing() -> list[dict]:
        return [to_document(o) for o in control.get(kind)]

    def get(name: str) -> dict:
        return to_document(control.get(kind, name)[0])

    def status(name: str) -> dict:
        obj = control.get(kind, name)[0]
        return obj.status.model_dump(mode="json", exclude_none=True) if obj.status else {}

    def describe(name: str) -> dict:
        """The object, its status and the reconciler's recent events for it (`forkd describe`)."""
        return control.describe(kind, name)

    def apply(document: dict = Body(...), manager: str = Query("api", pattern=r"^[a-z][a-z0-9-]{0,30}$"),
              force: bool = False, name: str | None = None) -> JSONResponse:
        doc = dict(document)
        doc.setdefault("apiVersion", "forkd.dev/v1alpha1")
        doc.setdefault("kind", kind)
        if doc["kind"] != kind and resolve_kind(str(doc["kind"])) != kind:
            raise InvalidInput(f"this is /v1/{plural}: kind must be {kind}, not {doc['kind']!r}")
        doc["kind"] = kind
        if name is not None:
            meta = dict(doc.get("metadata") or {})
            if meta.setdefault("name", name) != name:
                raise InvalidInput(f"metadata.name {meta['name']!r} differs from the path's {name!r}")
            doc["metadata"] = meta
        obj = MODELS[kind].model_validate(doc)
        (change,) = control.apply([(obj, f"api:/v1/{plural}")], f"api-{plural}", manager=manager, force=force)
        code = 201 if change.change == "created" else 200
        return JSONResponse({"change": change.change, "generation": change.generation,
                             "object": to_document(control.get(kind, key(obj))[0])}, status_code=code)

    def put(name: str, document: dict = Body(...),
            manager: str = Query("api", pattern=r"^[a-z][a-z0-9-]{0,30}$"), force: bool = False) -> JSONResponse:
        return apply(document, manager, force, name)

    def post(document: dict = Body(...), manager: str = Query("api", pattern=r"^[a-z][a-z0-9-]{0,30}$"),
             force: bool = False) -> JSONResponse:
        return apply(document, manager, force)

    def delete(name: str) -> Response:
        control.get(kind, name)  # 404 if absent
        control.delete(kind, name)
        return Response(status_code=204)

    r.add_api_route(f"/v1/{plural}", listing, methods=["GET"], tags=tag, name=f"list_{plural}")
    r.add_api_route(f"/v1/{plural}", post, methods=["POST"], tags=tag, name=f"apply_{plural}",
                    responses={201: {"description": "created"}})
    r.add_api_route(f"/v1/{plural}/{{name}}", get, methods=["GET"], tags=tag, name=f"get_{plural}")
    r.add_api_route(f"/v1/{plural}/{{name}}", put, methods=["PUT"], tags=tag, name=f"put_{plural}",
                    responses={201: {"description": "created (200: updated or unchanged)"}})
    r.add_api_route(f"/v1/{plural}/{{name}}", delete, methods=["DELETE"], tags=tag, name=f"delete_{plural}",
                    status_code=204)
    r.add_api_route(f"/v1/{plural}/{{name}}/status", status, methods=["GET"], tags=tag, name=f"status_{plural}")
    r.add_api_route(f"/v1/{plural}/{{name}}/describe", describe, methods=["GET"], tags=tag,
                    name=f"describe_{plural}")
