"""forkd's own verbs over HTTP, for the CLI's RemoteBackend: each handler parses, calls the LocalBackend method of
the same name (the code `forkd VERB` runs in-process) and returns its JSON, so a verb answers alike with and
without a daemon. Paths on these routes (pack files, OCI layouts) are on the daemon's host.

  GET  /v1/manifests[/{tag}]   snapshots / snapshot-info        DELETE /v1/manifests/{tag}   rmi
  POST /v1/build/parent|layer|compaction   snapshot create / snapshot-diff / snapshot-compact
  POST /v1/build/image|debian|from-image   image build / from-image
  GET  /v1/children            ls            POST /v1/children   fork       POST /v1/children/kill   kill
  POST /v1/gc, /v1/doctor, /v1/pack, /v1/unpack, /v1/pull, /v1/push          GET /v1/audit/verify
exec, eval, ping and branch use the upstream /v1/sandboxes routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Query

from forkd.base.settings import settings
from forkd.client import wire
from forkd.client.local import LocalBackend
from forkd.core import lifetimes
from forkd.core.requests import Compaction, LayerBuild, ParentBuild, Spawn


def build_forkd_router(backend: LocalBackend) -> APIRouter:
    r = APIRouter(tags=["forkd"])
    _snapshot_routes(r, backend)
    _child_and_host_routes(r, backend)
    return r


def _snapshot_routes(r: APIRouter, b: LocalBackend) -> None:
    @r.get("/v1/manifests")
    def snapshots() -> list[dict[str, Any]]:
        return b.snapshots()

    @r.get("/v1/manifests/{tag}")
    def snapshot_info(tag: str) -> dict[str, Any]:
        return b.snapshot_info(tag)

    @r.delete("/v1/manifests/{tag}")
    def rmi(tag: str, force: bool = False, cascade: bool = False) -> dict[str, Any]:
        return {"deleted": b.rmi(tag, force=force, cascade=cascade)}

    @r.post("/v1/build/parent", status_code=201)
    def create_snapshot(req: ParentBuild) -> dict[str, Any]:
        return b.create_snapshot(req)

    @r.post("/v1/build/layer", status_code=201)
    def snapshot_diff(req: LayerBuild) -> dict[str, Any]:
        return b.snapshot_diff(req)

    @r.post("/v1/build/compaction", status_code=201)
    def compact(req: Compaction) -> dict[str, Any]:
        return b.compact(req)

    @r.post("/v1/build/image")
    def build_image(req: wire.ImageBuildRequest | None = Body(None)) -> dict[str, Any]:
        return b.build_image(force=bool(req and req.force))

    @r.post("/v1/build/debian")
    def build_debian(req: wire.DebianBuildRequest) -> dict[str, Any]:
        return b.build_debian(req.packages, req.suite, force=req.force, rootfs=req.rootfs)

    @r.post("/v1/build/from-image", status_code=201)
    def from_image(req: wire.FromImageRequest) -> dict[str, Any]:
        return b.from_image(**req.model_dump())


def _child_routes(r: APIRouter, b: LocalBackend) -> None:
    @r.get("/v1/children")
    def children(label: list[str] | None = Query(None, description="k=v or k; repeat to AND")) -> list[dict]:
        return b.children(label)

    @r.post("/v1/children/{id}/timeout")
    def set_timeout(id: str, req: wire.TimeoutRequest) -> dict[str, Any]:
        return b.set_timeout(id, req.timeout_secs)

    @r.post("/v1/children/{id}/fork", status_code=201)
    def fork_from(id: str, req: wire.ForkFromRequest) -> list[dict[str, Any]]:
        """`forkd fork --from-sandbox ID`: children continuing from this instant of ID."""
        return b.fork_from(id, req.n, tag=req.tag, keep=req.keep,
                           lifetime=req.lifetime or settings().sandbox_timeout or None, egress=req.egress)

    @r.post("/v1/children", status_code=201)
    def fork(req: Spawn) -> dict[str, Any]:
        """`forkd fork` through the daemon: hand-made children live FORKD_SANDBOX_TIMEOUT (pool children: none)."""
        out = b.fork(req)
        ttl = settings().sandbox_timeout
        if ttl and req.pool is None:
            recs = {r.id: r for r in lifetimes.stamp(b.rt, [c["id"] for c in out], ttl)}
            out = [dict(c, expires_at=recs[c["id"]].expires_at) for c in out]
        return {"children": out}


def _child_and_host_routes(r: APIRouter, b: LocalBackend) -> None:
    _child_routes(r, b)

    @r.post("/v1/children/kill")
    def kill(req: wire.KillRequest) -> dict[str, Any]:
        tags = {c.snapshot for c in b.rt.children() if req.all or c.id in req.ids or c.snapshot == req.tag}
        killed = b.kill(req.ids, all_=req.all, tag=req.tag)
        for tag in tags:  # the snapshot of a fork(n) goes with the last of its children
            lifetimes.release_fork_of(b.rt, tag)
        return {"killed": killed}

    @r.post("/v1/gc")
    def gc(req: wire.GcRequest | None = Body(None)) -> dict[str, Any]:
        req = req or wire.GcRequest()
        return b.gc(dry_run=req.dry_run, grace=req.grace)

    @r.post("/v1/doctor")
    def doctor(req: wire.DoctorRequest | None = Body(None)) -> list[dict[str, Any]]:
        return b.doctor(reprobe=bool(req and req.reprobe))

    @r.get("/v1/audit/verify")
    def audit_verify() -> dict[str, Any]:
        return b.audit_verify()

    @r.post("/v1/pack", status_code=201)
    def pack(req: wire.PackRequest) -> dict[str, Any]:
        return b.pack(req.tag, req.path, level=req.level)

    @r.post("/v1/unpack")
    def unpack(req: wire.UnpackRequest) -> dict[str, Any]:
        return b.unpack(req.path)

    @r.post("/v1/pull")
    def pull(req: wire.PullRequest) -> dict[str, Any]:
        return b.pull(req.ref, req.hub)

    @r.post("/v1/push")
    def push(req: wire.PushRequest) -> dict[str, Any]:
        return b.push(req.tag, req.ref, req.hub, force=req.force)
