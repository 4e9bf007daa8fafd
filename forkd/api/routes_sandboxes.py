"""The compatibility layer `/v1/sandboxes`: upstream forkd's REST surface and the calls the E2B-style SDKs make
(forkd_client, the TypeScript SDK, `forkd-mcp`), an adapter over the service (forkd.service.Service). Each
parses upstream's body, calls the same service verb as the native `/v1/children` routes (so lifetimes, labels and
the fork snapshot's release are the service's, not the route's) and answers upstream's shapes: a child's view
(forkd.service.listing.ChildView) as upstream's SandboxInfo. The calls on one child are mounted under
`/v1/children/{id}/` too (forkd.api.routes_children.child_calls)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse

from forkd.api.guestio import GuestIO
from forkd.core.requests import Spawn
from forkd.service import Service, wire

TAGS = ["sandboxes"]


def build_sandbox_router(s: Service, metrics: Any, gate: GuestIO) -> APIRouter:
    r = APIRouter()
    _lifecycle_routes(r, s, metrics)
    _call_routes(r, s, gate)
    _branch_routes(r, s, metrics)
    return r


def _lifecycle_routes(r: APIRouter, s: Service, metrics: Any) -> None:
    @r.get("/v1/sandboxes", tags=TAGS)
    def list_sandboxes(label: list[str] | None = Query(None, description="k=v (or k): only sandboxes with that "
                                                                           "label; repeat to AND them")
                       ) -> list[wire.SandboxInfo]:
        return [wire.sandbox_info(v) for v in s.views(label)]

    @r.post("/v1/sandboxes", status_code=201, tags=TAGS)
    def spawn(req: wire.SpawnRequest) -> list[wire.SandboxInfo]:
        """Fork `n` children of a ready snapshot; returns when every one answered (409: snapshot not ready).
        `snapshot_tag` may name a ForkParent, ForkLayer or ForkBranch too (E2B's template): its ready snapshot.
        Each lives `lifetime_secs` (default FORKD_SANDBOX_TIMEOUT) unless extended; `prewarm` is honoured
        (always: spawn returns once each guest answered); `live_fork` is a no-op (every child can branch live).
        `per_child_netns: true` needs a parent built with a NIC; `memory_limit_mib`: a per-child cgroup
        (placement fails closed); `egress`: what each child may reach (refused on a snapshot without a NIC)."""
        t0 = time.perf_counter()
        views = s.spawn(Spawn.of(tag=req.snapshot_tag, n=req.n, timeout=req.timeout_secs,
                                 network="isolated" if req.per_child_netns else None,
                                 memory_limit_mib=req.memory_limit_mib, egress=req.egress),
                        lifetime=req.lifetime_secs, labels=req.labels)
        metrics.spawn_request_seconds.observe(time.perf_counter() - t0)  # each child: forkd.base.telemetry
        return [wire.sandbox_info(v) for v in views]

    @r.get("/v1/sandboxes/{id}", tags=TAGS)
    def get_sandbox(id: str) -> wire.SandboxInfo:
        return wire.sandbox_info(s.view(id))

    @r.delete("/v1/sandboxes/{id}", status_code=204, tags=TAGS)
    def kill_sandbox(id: str) -> Response:
        s.kill_one(id)
        return Response(status_code=204)

    @r.post("/v1/sandboxes/{id}/timeout", tags=TAGS)
    def set_timeout(id: str, req: wire.TimeoutRequest) -> wire.SandboxInfo:
        """Keepalive: the sandbox now expires `timeout_secs` from now (E2B's set_timeout)."""
        return wire.sandbox_info(s.set_timeout(id, req.timeout_secs))

    @r.post("/v1/sandboxes/{id}/fork", status_code=201, tags=TAGS)
    def fork(id: str, req: wire.ForkRequest | None = Body(None)) -> list[wire.SandboxInfo]:
        """N running sandboxes that continue from this instant: a live branch of `id` (which keeps running) and
        `n` children of it. The branch snapshot is removed with the last of them unless `keep` or `tag`."""
        req = req or wire.ForkRequest()
        res, views = s.fork_from(id, req.n, tag=req.tag, keep=req.keep, lifetime=req.lifetime_secs,
                                 labels=req.labels, timeout=req.timeout_secs, egress=req.egress)
        if res.pause_ms is not None:
            metrics.branch_pause_seconds.labels("live").observe(res.pause_ms / 1000.0)
        return [wire.sandbox_info(v) for v in views]


def _call_routes(r: APIRouter, s: Service, gate: GuestIO) -> None:
    @r.post("/v1/sandboxes/{id}/ping", tags=TAGS)
    async def ping(request: Request, id: str) -> wire.PingResult:
        return await gate.run(id, request, s.ping, id)

    @r.post("/v1/sandboxes/{id}/exec", tags=TAGS)
    async def exec_(request: Request, id: str, req: wire.ExecRequest) -> wire.ExecResult:
        return await gate.run(id, request, lambda: s.exec(id, req.args, cwd=req.cwd, timeout=req.timeout_secs,
                                                          env=req.env, stdin=req.stdin))

    @r.post("/v1/sandboxes/{id}/eval", tags=TAGS)
    async def eval_(request: Request, id: str, req: wire.EvalRequest) -> wire.EvalResult:
        res = await gate.run(id, request, lambda: s.eval(id, req.code, timeout=req.timeout_secs, mode=req.mode))
        return wire.eval_result(res)

    @r.get("/v1/sandboxes/{id}/files", tags=TAGS, responses={200: {"content": {"application/octet-stream": {}}}})
    async def read_file(request: Request, id: str,
                        path: str = Query(..., description="absolute path in the guest")) -> Response:
        data = await gate.run(id, request, lambda: s.read_file(id, path))
        return Response(data, media_type="application/octet-stream")

    @r.put("/v1/sandboxes/{id}/files", tags=TAGS)
    async def write_file(id: str, request: Request,
                         path: str = Query(..., description="absolute path in the guest"),
                         mode: int = Query(0o644, ge=0, le=0o7777)) -> wire.FileWritten:
        """The request body is the file's content (raw bytes)."""
        data = await request.body()
        await gate.run(id, request, lambda: s.write_file(id, path, data, mode=mode))
        return wire.FileWritten(path=path, bytes=len(data))


def _branch_routes(r: APIRouter, s: Service, metrics: Any) -> None:
    @r.post("/v1/sandboxes/{id}/branch", status_code=201, tags=TAGS,
            responses={202: {"description": "wait: false; the snapshot is still `writing`"}})
    def branch(id: str, req: wire.BranchRequest | None = Body(None)) -> Any:
        """Snapshot a running sandbox into a new forkable tag. 201 when written (wait: true), 202 with
        status `writing` when `wait: false` (poll GET /v1/snapshots/{tag}). Without `tag` forkd names it and
        removes it FORKD_BRANCH_TTL after it was written unless a child or layer uses it."""
        req = req or wire.BranchRequest()
        mode = "diff" if req.diff else req.mode
        res = s.branch(id, req.tag, mode=mode, wait=req.wait)
        if res.pause_ms is not None:
            metrics.branch_pause_seconds.labels(mode).observe(res.pause_ms / 1000.0)
        out = wire.branch_result(s.info(res.snapshot), res, mode)
        if not req.wait:
            return JSONResponse(out.model_dump(mode="json"), status_code=202)
        return out
