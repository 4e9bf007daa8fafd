"""forkd's native child routes (`/v1/children`): each handler parses, calls the service verb LocalBackend calls
in-process (forkd.service.Service) and answers the same typed views (forkd.service.listing.ChildView), so a verb
answers alike with and without a daemon. Paths in bodies (pack files) are on the daemon's host.

  GET  /v1/children            ls              POST /v1/children           fork
  GET  /v1/children/{id}       one child       DELETE /v1/children/{id}    kill one
  POST /v1/children/kill       kill            POST /v1/children/{id}/fork fork --from-sandbox
  POST /v1/children/{id}/timeout               POST /v1/gc, /v1/doctor, /v1/pack, /v1/unpack, /v1/pull, /v1/push
  POST /v1/snapshots/{push,pull}               GET /v1/audit/verify
A child's calls (exec, eval, ping, branch, files, processes, logs, ports) are one handler mounted under both
`/v1/children/{id}/...` and upstream's `/v1/sandboxes/{id}/...` (`child_calls`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Query, Response
from fastapi.routing import APIRoute

from forkd.core.requests import Spawn
from forkd.service import Service, wire
from forkd.service.listing import ChildView

NATIVE, COMPAT = "/v1/children/{id}/", "/v1/sandboxes/{id}/"
OWN_CALLS = frozenset({"timeout", "fork"})  # the compatibility layer's own shapes: not mounted natively


def build_children_router(s: Service) -> APIRouter:
    r = APIRouter(tags=["forkd"])
    _child_routes(r, s)
    _host_routes(r, s)
    _chain_routes(r, s)
    return r


def _child_routes(r: APIRouter, s: Service) -> None:
    @r.get("/v1/children")
    def children(label: list[str] | None = Query(None, description="k=v or k; repeat to AND")) -> list[ChildView]:
        return s.views(label)

    @r.get("/v1/children/{id}")
    def child(id: str) -> ChildView:
        return s.view(id)

    @r.delete("/v1/children/{id}", status_code=204)
    def kill_one(id: str) -> Response:
        """Stop one child (404 if there is none); a fork(n) snapshot goes with its last child."""
        s.kill_one(id)
        return Response(status_code=204)

    @r.post("/v1/children/{id}/timeout")
    def set_timeout(id: str, req: wire.TimeoutRequest) -> ChildView:
        return s.set_timeout(id, req.timeout_secs)

    @r.post("/v1/children/{id}/fork", status_code=201)
    def fork_from(id: str, req: wire.ForkFromRequest) -> list[ChildView]:
        """`forkd fork --from-sandbox ID`: children continuing from this instant of ID."""
        return s.fork_from(id, req.n, tag=req.tag, keep=req.keep, lifetime=req.lifetime, egress=req.egress)[1]

    @r.post("/v1/children", status_code=201)
    def fork(req: Spawn) -> wire.Forked:
        """`forkd fork`: hand-made children live FORKD_SANDBOX_TIMEOUT (pool children: none)."""
        return wire.Forked(children=s.spawn(req))

    @r.post("/v1/children/kill")
    def kill(req: wire.KillRequest) -> dict[str, Any]:
        """Stop children; the snapshot of a fork(n) goes with the last of its children."""
        return {"killed": [[cid, was] for cid, was in s.kill(req.ids, all_=req.all, tag=req.tag)]}


def child_calls(*routers: APIRouter) -> APIRouter:
    """Every call on one child that the compatibility layer serves (`/v1/sandboxes/{id}/X` in `routers`), mounted
    under the native `/v1/children/{id}/X`: the same handler, so the two cannot answer differently."""
    r = APIRouter(tags=["children"])
    for route in (x for router in routers for x in router.routes):
        if not (isinstance(route, APIRoute) and route.path.startswith(COMPAT)):
            continue
        if route.path[len(COMPAT):].split("/")[0] in OWN_CALLS:
            continue
        r.add_api_route(
            NATIVE + route.path[len(COMPAT):], route.endpoint, methods=sorted(route.methods),
            name=f"child_{route.name}", response_model=route.response_model, status_code=route.status_code,
            responses=route.responses, response_class=route.response_class, summary=route.summary,
            description=route.description, openapi_extra=route.openapi_extra)
    return r


def _host_routes(r: APIRouter, s: Service) -> None:
    @r.post("/v1/gc")
    def gc(req: wire.GcRequest | None = Body(None)) -> dict[str, Any]:
        req = req or wire.GcRequest()
        return s.gc(dry_run=req.dry_run, grace=req.grace)

    @r.post("/v1/doctor")
    def doctor(req: wire.DoctorRequest | None = Body(None)) -> list[dict[str, Any]]:
        return s.doctor(reprobe=bool(req and req.reprobe))

    @r.get("/v1/audit/verify")
    def audit_verify() -> dict[str, Any]:
        return s.audit_verify()


def _chain_routes(r: APIRouter, s: Service) -> None:
    @r.post("/v1/pack", status_code=201)
    def pack(req: wire.PackRequest) -> dict[str, Any]:
        return s.pack(req.tag, req.path, level=req.level)

    @r.post("/v1/unpack")
    def unpack(req: wire.UnpackRequest) -> dict[str, Any]:
        return s.unpack(req.path)

    @r.post("/v1/pull")
    def pull(req: wire.PullRequest) -> dict[str, Any]:
        return s.pull(req.ref, req.hub)

    @r.post("/v1/push")
    def push(req: wire.PushRequest) -> dict[str, Any]:
        return s.push(req.tag, req.ref, req.hub, force=req.force)

    @r.post("/v1/snapshots/push", status_code=201)
    def snapshot_push(req: wire.SnapshotPushRequest) -> dict[str, Any]:
        return s.snapshot_push(req)

    @r.post("/v1/snapshots/pull")
    def snapshot_pull(req: wire.SnapshotPullRequest) -> dict[str, Any]:
        return s.snapshot_pull(req)
