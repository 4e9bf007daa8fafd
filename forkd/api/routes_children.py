"""forkd's own child and host routes, for the CLI's RemoteBackend: each handler parses, calls the service verb
LocalBackend calls in-process (forkd.service.Service) and answers LocalBackend's JSON, so a verb answers alike with
and without a daemon. Paths in bodies (pack files) are on the daemon's host.

  GET  /v1/children            ls            POST /v1/children   fork       POST /v1/children/kill   kill
  POST /v1/children/{id}/fork  fork --from-sandbox                POST /v1/children/{id}/timeout
  POST /v1/gc, /v1/doctor, /v1/pack, /v1/unpack, /v1/pull, /v1/push, /v1/snapshots/{push,pull}   GET /v1/audit/verify
exec, eval, ping and branch use the upstream /v1/sandboxes routes (forkd.api.routes_sandboxes).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Query

from forkd.core.requests import Spawn
from forkd.service import Service, wire


def build_children_router(s: Service) -> APIRouter:
    r = APIRouter(tags=["forkd"])
    _child_routes(r, s)
    _host_routes(r, s)
    _chain_routes(r, s)
    return r


def _child_routes(r: APIRouter, s: Service) -> None:
    @r.get("/v1/children")
    def children(label: list[str] | None = Query(None, description="k=v or k; repeat to AND")) -> list[dict]:
        return [wire.child_view(c) for c in s.children(label)]

    @r.post("/v1/children/{id}/timeout")
    def set_timeout(id: str, req: wire.TimeoutRequest) -> dict[str, Any]:
        return wire.child_view(s.set_timeout(id, req.timeout_secs))

    @r.post("/v1/children/{id}/fork", status_code=201)
    def fork_from(id: str, req: wire.ForkFromRequest) -> list[dict[str, Any]]:
        """`forkd fork --from-sandbox ID`: children continuing from this instant of ID."""
        _, recs = s.fork_from(id, req.n, tag=req.tag, keep=req.keep, lifetime=req.lifetime, egress=req.egress)
        return [wire.child_view(c) for c in recs]

    @r.post("/v1/children", status_code=201)
    def fork(req: Spawn) -> dict[str, Any]:
        """`forkd fork`: hand-made children live FORKD_SANDBOX_TIMEOUT (pool children: none)."""
        return {"children": [wire.child_view(c) for c in s.spawn(req)]}

    @r.post("/v1/children/kill")
    def kill(req: wire.KillRequest) -> dict[str, Any]:
        """Stop children; the snapshot of a fork(n) goes with the last of its children."""
        return {"killed": [[cid, was] for cid, was in s.kill(req.ids, all_=req.all, tag=req.tag)]}


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
