"""Upstream-compatible `/v1` routes (snapshots, sandboxes) and forkd's own (pools and the other kinds, claim,
files). Handlers parse, call the core or the reconciler's Control, and return the wire models of
forkd.client.wire; failures are ForkdErrors that app.py turns into problem+json."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse

from forkd.api.guestio import GuestIO
from forkd.base.errors import ForkdError, InvalidInput, NotFound
from forkd.base.settings import settings
from forkd.client import wire
from forkd.core import forking, lifetimes
from forkd.core.capacity import node_capacity
from forkd.core.requests import Branch, Compaction, LayerBuild, ParentBuild, Spawn
from forkd.reconciler.control import Control, resolve_kind
from forkd.reconciler.objects import key
from forkd.spec.models import MODELS, to_document

KINDS = {"parents": "ForkParent", "layers": "ForkLayer", "pools": "ForkPool", "branches": "ForkBranch",
         "claims": "ForkClaim"}
FILE_NOT_FOUND = {"FileNotFoundError", "IsADirectoryError", "NotADirectoryError"}


class NotSupported(ForkdError):
    """A field upstream has and forkd does not implement yet: 501."""

    http_status = 501


def build_router(control: Control, metrics, gate: GuestIO) -> APIRouter:
    rt = control.rt
    r = APIRouter()

    def snap_info(tag: str) -> wire.SnapshotInfo:
        return wire.snapshot_info(rt.store.get(tag), str(rt.store.dir(tag)))

    # -- snapshots -----------------------------------------------------------------------------------
    @r.get("/v1/snapshots", tags=["snapshots"])
    def list_snapshots() -> list[wire.SnapshotInfo]:
        return [wire.snapshot_info(s, str(rt.store.dir(s.tag))) for s in rt.snapshots() if hasattr(s, "tag")]

    @r.post("/v1/snapshots", status_code=201, tags=["snapshots"])
    def create_snapshot(req: wire.CreateSnapshotRequest) -> wire.SnapshotInfo:
        """Boot a parent, warm it and snapshot it (blocks until ready); with `from_tag`, build a diff layer.
        Upstream's `kernel`, `rootfs`, `tap` and `rw: false` are refused (422, with the reason); `boot_wait_secs`
        is the parent's boot timeout; `rw: true` is what every forkd child has (a private writable disk)."""
        _refuse_upstream_build(req)
        if req.from_tag:
            snap = rt.snapshot_diff(LayerBuild.of(tag=req.tag, parent_tag=req.from_tag, run=tuple(req.warm_run),
                                    imports=tuple(req.warm_imports), code=tuple(req.warm_exec), labels=req.labels))
        else:
            extra = {"boot_timeout": req.boot_wait_secs} if req.boot_wait_secs else {}
            snap = rt.create_snapshot(ParentBuild.of(tag=req.tag, memory_mib=req.memory_mib, vcpus=req.vcpus,
                                      warm_imports=tuple(req.warm_imports), warm_run=tuple(req.warm_run),
                                      warm_exec=tuple(req.warm_exec), labels=req.labels, **extra))
        return wire.snapshot_info(snap, str(rt.store.dir(snap.tag)))

    @r.get("/v1/snapshots/{tag}", tags=["snapshots"])
    def get_snapshot(tag: str) -> wire.SnapshotInfo:
        return snap_info(tag)

    @r.get("/v1/snapshots/{tag}/info", tags=["snapshots"])
    def snapshot_info(tag: str) -> wire.SnapshotDetail:
        info = rt.snapshot_info(tag)
        base = snap_info(tag).model_dump()
        keys = ("depth", "ancestors", "dependents", "children", "logical_bytes", "stored_bytes", "chain_ok",
                "chain_error", "materialized", "memory_sha256", "diff_pages", "warm_imports", "qemu_version")
        base.update({k: info.get(k) for k in keys if k in info})
        return wire.SnapshotDetail(**base)

    @r.delete("/v1/snapshots/{tag}", status_code=204, tags=["snapshots"])
    def delete_snapshot(tag: str, cascade: bool = False, force: bool = False) -> Response:
        """409 while children of it run or layers depend on it (named), unless `cascade` or `force`."""
        rt.rmi(tag, force=force, cascade=cascade)
        return Response(status_code=204)

    @r.post("/v1/snapshots/{tag}/compact", status_code=201, tags=["snapshots"])
    def compact(tag: str, req: wire.CompactRequest) -> wire.SnapshotInfo:
        snap = rt.compact(Compaction.of(from_tag=tag, to_tag=req.to))
        return wire.snapshot_info(snap, str(rt.store.dir(snap.tag)))

    @r.get("/v1/node", tags=["status"])
    def node() -> dict:
        """This node's capacity for placement: memory available to children, running children (per pool)."""
        return node_capacity(rt)

    # -- sandboxes -----------------------------------------------------------------------------------
    @r.get("/v1/sandboxes", tags=["sandboxes"])
    def list_sandboxes(label: list[str] | None = Query(None, description="k=v (or k): only sandboxes with that "
                                                                           "label; repeat to AND them")
                       ) -> list[wire.SandboxInfo]:
        sel = lifetimes.parse_selector(label)
        return [wire.sandbox_info(c) for c in rt.children() if lifetimes.matches(c.labels, sel)]

    @r.post("/v1/sandboxes", status_code=201, tags=["sandboxes"])
    def spawn(req: wire.SpawnRequest) -> list[wire.SandboxInfo]:
        """Fork `n` children of a ready snapshot; returns when every one answered (409: snapshot not ready).
        `snapshot_tag` may name a ForkParent, ForkLayer or ForkBranch too (E2B's template): its ready snapshot.
        Each lives `lifetime_secs` (default FORKD_SANDBOX_TIMEOUT) unless extended; `prewarm` is honoured
        (always: spawn returns once each guest answered); `live_fork` is a no-op (every child can branch live)."""
        # per_child_netns: true needs a parent built with a NIC (network isolated); children of such a parent are
        # always isolated. memory_limit_mib: a per-child cgroup, placement fails closed. egress: what each child may
        # reach (default none), refused on a snapshot without a NIC.
        t0 = time.perf_counter()
        recs = rt.fork(Spawn.of(tag=control.template(req.snapshot_tag), n=req.n, timeout=req.timeout_secs,
                       network="isolated" if req.per_child_netns else None, memory_limit_mib=req.memory_limit_mib,
                       egress=req.egress))
        metrics.spawn_request_seconds.observe(time.perf_counter() - t0)  # each child: forkd.base.telemetry
        recs = lifetimes.stamp(rt, [x.id for x in recs], _lifetime(req.lifetime_secs), req.labels)
        return [wire.sandbox_info(rec) for rec in recs]

    @r.get("/v1/sandboxes/{id}", tags=["sandboxes"])
    def get_sandbox(id: str) -> wire.SandboxInfo:
        return wire.sandbox_info(rt.child(id))

    @r.delete("/v1/sandboxes/{id}", status_code=204, tags=["sandboxes"])
    def kill_sandbox(id: str) -> Response:
        tag = rt.child(id).snapshot
        rt.kill([id])
        lifetimes.release_fork_of(rt, tag)  # the snapshot of fork(n) goes with the last of its children
        return Response(status_code=204)

    @r.post("/v1/sandboxes/{id}/timeout", tags=["sandboxes"])
    def set_timeout(id: str, req: wire.TimeoutRequest) -> wire.SandboxInfo:
        """Keepalive: the sandbox now expires `timeout_secs` from now (E2B's set_timeout)."""
        return wire.sandbox_info(lifetimes.set_timeout(rt, id, req.timeout_secs))

    @r.post("/v1/sandboxes/{id}/fork", status_code=201, tags=["sandboxes"])
    def fork(id: str, req: wire.ForkRequest | None = Body(None)) -> list[wire.SandboxInfo]:
        """N running sandboxes that continue from this instant: a live branch of `id` (which keeps running) and
        `n` children of it. The branch snapshot is removed with the last of them unless `keep` or `tag`."""
        req = req or wire.ForkRequest()
        res, recs = forking.fork(rt, id, req.n, tag=req.tag, keep=req.keep, lifetime=_lifetime(req.lifetime_secs),
                                 labels=req.labels, timeout=req.timeout_secs, egress=req.egress)
        if res.pause_ms is not None:
            metrics.branch_pause_seconds.labels("live").observe(res.pause_ms / 1000.0)
        return [wire.sandbox_info(rec) for rec in recs]

    @r.post("/v1/sandboxes/{id}/ping", tags=["sandboxes"])
    async def ping(request: Request, id: str) -> wire.PingResult:
        return wire.PingResult(**{**await gate.run(id, request, rt.ping, id), "pong": True})

    @r.post("/v1/sandboxes/{id}/exec", tags=["sandboxes"])
    async def exec_(request: Request, id: str, req: wire.ExecRequest) -> wire.ExecResult:
        res = await gate.run(id, request, lambda: rt.exec(id, req.args, env=req.env, cwd=req.cwd, stdin=req.stdin,
                                                          timeout=req.timeout_secs))
        return wire.ExecResult(**res)

    @r.post("/v1/sandboxes/{id}/eval", tags=["sandboxes"])
    async def eval_(request: Request, id: str, req: wire.EvalRequest) -> wire.EvalResult:
        call = rt.eval if req.mode == "eval" else rt.exec_code
        res = await gate.run(id, request, lambda: call(id, req.code, timeout=req.timeout_secs))
        return wire.EvalResult(result=res.get("value"), error=res.get("error"),
                               exit_code=1 if res.get("error") else 0, stdout=res.get("stdout", ""),
                               stderr=res.get("stderr", ""))

    @r.post("/v1/sandboxes/{id}/branch", status_code=201, tags=["sandboxes"],
            responses={202: {"description": "wait: false; the snapshot is still `writing`"}})
    def branch(id: str, req: wire.BranchRequest | None = Body(None)) -> Any:
        """Snapshot a running sandbox into a new forkable tag. 201 when written (wait: true), 202 with
        status `writing` when `wait: false` (poll GET /v1/snapshots/{tag})."""
        req = req or wire.BranchRequest()
        try:
            from forkd.core.branch import branch as do_branch
        except ImportError:
            raise NotSupported("branch is not available in this build of forkd") from None
        mode = "diff" if req.diff else req.mode
        tag = req.tag or f"branch-{id}-{int(time.time())}"
        auto = {} if req.tag else {lifetimes.AUTO: "branch"}  # removed after FORKD_BRANCH_TTL when unused
        res = do_branch(rt, Branch.of(child_id=id, tag=tag, mode=mode, wait=req.wait, labels=auto))
        if res.pause_ms is not None:
            metrics.branch_pause_seconds.labels(mode).observe(res.pause_ms / 1000.0)
        info = wire.snapshot_info(res.snapshot, str(rt.store.dir(tag)))
        out = wire.BranchResult(**info.model_dump(), mode=mode, pause_ms=res.pause_ms, returned_ms=res.returned_ms,
                                capture=res.capture, capture_note=res.capture_note)
        if not req.wait:
            return JSONResponse(out.model_dump(mode="json"), status_code=202)
        return out

    @r.get("/v1/sandboxes/{id}/files", tags=["sandboxes"],
           responses={200: {"content": {"application/octet-stream": {}}}})
    async def read_file(request: Request, id: str,
                        path: str = Query(..., description="absolute path in the guest")) -> Response:
        def read() -> bytes:
            with _agent_errors(path), rt.agent(id) as a:
                return a.read_file(path)
        return Response(await gate.run(id, request, read), media_type="application/octet-stream")

    @r.put("/v1/sandboxes/{id}/files", tags=["sandboxes"])
    async def write_file(id: str, request: Request,
                         path: str = Query(..., description="absolute path in the guest"),
                         mode: int = Query(0o644, ge=0, le=0o7777)) -> wire.FileWritten:
        """The request body is the file's content (raw bytes)."""
        data = await request.body()

        def write() -> None:
            with _agent_errors(path), rt.agent(id) as a:
                a.write_file(path, data, mode=mode)
        await gate.run(id, request, write)
        return wire.FileWritten(path=path, bytes=len(data))

    # -- pools and the other kinds ------------------------------------------------------------------------
    for plural, kind in KINDS.items():
        _kind_routes(r, control, plural, kind)

    @r.post("/v1/pools/{name}/claim", tags=["pools"])
    def claim(name: str, req: wire.ClaimRequest | None = Body(None)) -> wire.ClaimResult:
        req = req or wire.ClaimRequest()
        t0 = time.perf_counter()
        recs = control.claim(name, req.n, lifetime=req.lifetime_secs)
        dt = time.perf_counter() - t0  # forkd_claim_seconds: observed by control.claim (forkd.base.telemetry)
        return wire.ClaimResult(children=[wire.child_view(x) for x in recs],
                                sandboxes=[wire.sandbox_info(x) for x in recs], claim_ms=dt * 1000.0)

    return r


def _lifetime(asked: float | None) -> float | None:
    """A call's lifetime, else the daemon's FORKD_SANDBOX_TIMEOUT (0: none)."""
    return asked if asked else (settings().sandbox_timeout or None)


UPSTREAM_REFUSED = {
    "kernel": "forkd boots its own guest kernel (virtio drivers, its agent as PID 1); a user kernel is not booted",
    "rootfs": "a user ext4 rootfs is not booted: forkd would have to read an untrusted filesystem to inject its "
              "agent, and it does not mount images; build from an OCI image instead (POST /v1/build/from-image, "
              "`forkd from-image`)",
    "tap": "forkd makes each child's network itself (per-child namespace and tap, spawn with per_child_netns); "
           "it does not attach a host tap you name",
}


def _refuse_upstream_build(req: wire.CreateSnapshotRequest) -> None:
    """Upstream's create_snapshot fields forkd cannot honour: 422 with the reason, never a default image."""
    bad = [f"{k}: {why}" for k, why in UPSTREAM_REFUSED.items() if getattr(req, k) is not None]
    if req.rw is False:
        bad.append("rw: false: every forkd child writes to its own private copy of the disk; a read-only root "
                   "is not offered")
    if bad:
        raise Unprocessable("; ".join(bad), hint="drop these fields; see README (upstream's create_snapshot)")


class Unprocessable(InvalidInput):
    """A well-formed field forkd refuses to honour: 422."""

    http_status = 422


def _kind_routes(r: APIRouter, control: Control, plural: str, kind: str) -> None:
    tag = [plural]

    def listing() -> list[dict]:
        return [to_document(o) for o in control.get(kind)]

    def get(name: str) -> dict:
        return to_document(control.get(kind, name)[0])

    def status(name: str) -> dict:
        obj = control.get(kind, name)[0]
        return obj.status.model_dump(mode="json", exclude_none=True) if obj.status else {}

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


class _agent_errors:
    """Guest file errors become 404 / 400 instead of 500."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, et, exc, tb):
        from forkd.vmm.agent_replies import AgentError

        if isinstance(exc, AgentError):
            typ = exc.error.get("type")
            if typ in FILE_NOT_FOUND:
                raise NotFound(f"{self.path}: {exc.error.get('message')}") from exc
            if typ in ("RequestError", "PermissionError"):
                raise InvalidInput(f"{self.path}: {exc.error.get('message')}") from exc
        return False
