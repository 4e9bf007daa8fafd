"""Snapshot routes: one family under `/v1/snapshots` (and guest images under `/v1/images`). Each handler parses
and calls the service (forkd.service.Service) that LocalBackend calls in-process, and a snapshot answers as its
typed view (forkd.service.listing.SnapshotView), which holds every field of upstream's SnapshotInfo, so upstream's
clients read it unchanged. Paths in bodies (OCI layouts) are on the daemon's host.

  GET  /v1/snapshots               snapshots            POST /v1/snapshots              build (upstream's body)
  GET  /v1/snapshots/{tag}         one snapshot         DELETE /v1/snapshots/{tag}      rmi (204, as upstream)
  GET  /v1/snapshots/{tag}/info    snapshot-info        POST /v1/snapshots/{tag}/delete rmi, answering the tags
  POST /v1/snapshots/{tag}/compact upstream's compaction
  POST /v1/snapshots/build/parent|layer|compaction|from-image   forkd's build requests (snapshot, snapshot-diff...)
  POST /v1/images/build|debian     image build (the base image, a Debian one)
A build is a job (forkd.service.jobs; GET /v1/jobs/{id}): forkd's build routes answer 202 and the job unless
`?wait=true`; upstream's POST /v1/snapshots and /compact block by default, as upstream's clients expect
(`?wait=false`: the job).
`ALIASES`: the previous release's `/v1/manifests` and `/v1/build/*`, the very handlers mounted again, deprecated;
the old build URLs block by default, as they did.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from forkd.base.errors import InvalidInput
from forkd.core.requests import Compaction, LayerBuild, ParentBuild
from forkd.service import Service, wire
from forkd.service.listing import SnapshotView

UPSTREAM_REFUSED = {
    "kernel": "forkd boots its own guest kernel (virtio drivers, its agent as PID 1); a user kernel is not booted",
    "rootfs": "a user ext4 rootfs is not booted: forkd would have to read an untrusted filesystem to inject its "
              "agent, and it does not mount images; build from an OCI image instead (POST "
              "/v1/snapshots/build/from-image, `forkd from-image`)",
    "tap": "forkd makes each child's network itself (per-child namespace and tap, spawn with per_child_netns); "
           "it does not attach a host tap you name",
}
# (method, deprecated path) -> (method, native path): the same endpoint, mounted under both
ALIASES = {
    ("GET", "/v1/manifests"): ("GET", "/v1/snapshots"),
    ("GET", "/v1/manifests/{tag}"): ("GET", "/v1/snapshots/{tag}/info"),
    ("DELETE", "/v1/manifests/{tag}"): ("POST", "/v1/snapshots/{tag}/delete"),
    ("POST", "/v1/build/parent"): ("POST", "/v1/snapshots/build/parent"),
    ("POST", "/v1/build/layer"): ("POST", "/v1/snapshots/build/layer"),
    ("POST", "/v1/build/compaction"): ("POST", "/v1/snapshots/build/compaction"),
    ("POST", "/v1/build/from-image"): ("POST", "/v1/snapshots/build/from-image"),
    ("POST", "/v1/build/image"): ("POST", "/v1/images/build"),
    ("POST", "/v1/build/debian"): ("POST", "/v1/images/debian"),
}


class Unprocessable(InvalidInput):
    """A well-formed field forkd refuses to honour: 422."""

    http_status = 422


def build_snapshot_router(s: Service) -> APIRouter:
    r = APIRouter(tags=["snapshots"])
    _snapshot_routes(r, s)
    _upstream_builds(r, s)
    _build_routes(r, s)
    return deprecated_aliases(r)


def _snapshot_routes(r: APIRouter, s: Service) -> None:
    @r.get("/v1/snapshots")
    def snapshots() -> list[SnapshotView]:
        """`forkd snapshot ls`: every snapshot; one whose record cannot be read is listed `failed`, `corrupt`."""
        return s.snapshots()

    @r.get("/v1/snapshots/{tag}")
    def snapshot(tag: str) -> SnapshotView:
        """One snapshot (poll it while a `wait: false` branch is `writing`)."""
        return s.snapshot(tag)

    @r.get("/v1/snapshots/{tag}/info")
    def snapshot_info(tag: str) -> wire.SnapshotDetail:
        """`forkd snapshot info`: the snapshot, its chain, dependents, running children, sizes and hashes."""
        return s.snapshot_detail(tag)

    @r.delete("/v1/snapshots/{tag}", status_code=204)
    def delete_snapshot(tag: str, cascade: bool = False, force: bool = False) -> Response:
        """409 while children of it run or layers depend on it (named), unless `cascade` or `force`."""
        s.rmi(tag, force=force, cascade=cascade)
        return Response(status_code=204)

    @r.post("/v1/snapshots/{tag}/delete")
    def rmi(tag: str, cascade: bool = False, force: bool = False) -> dict[str, list[str]]:
        """`forkd snapshot rm`: as DELETE, answering the tags it deleted (`cascade`: the layers on it too)."""
        return {"deleted": s.rmi(tag, force=force, cascade=cascade)}


WAIT = "block until the build is done and answer what it built (201), instead of its job (202)"
UPSTREAM_WAIT = "false: answer the build's job at once (202; GET /v1/jobs/{id}) instead of blocking until it is done"
JOB = {202: {"model": wire.Job, "description": "the build's job (poll GET /v1/jobs/{id}, Location)"}}


def _build(s: Service, kind: str, req: Any, wait: bool, done: int = 201) -> Response:
    """A build as a job: 202 with the job (its URL in Location); with `wait`, the build's answer once done (or
    the error it failed with, as a blocking call raised it)."""
    job = s.build_job(kind, req)
    if not wait:
        return JSONResponse(job.model_dump(mode="json"), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"})
    return JSONResponse(s.jobs.outcome(job.id), status_code=done)


def _upstream_builds(r: APIRouter, s: Service) -> None:
    @r.post("/v1/snapshots", status_code=201, response_model=SnapshotView, responses=JOB)
    def create_snapshot(req: wire.CreateSnapshotRequest, wait: bool = Query(True, description=UPSTREAM_WAIT)) -> Any:
        """Boot a parent, warm it and snapshot it (blocks until ready, as upstream; `wait=false`: a job); with
        `from_tag`, build a diff layer. Upstream's `kernel`, `rootfs`, `tap` and `rw: false` are refused (422, with
        the reason); `boot_wait_secs` is the parent's boot timeout; `rw: true` is what every forkd child has (a
        private writable disk)."""
        _refuse_upstream_build(req)
        if req.from_tag:
            return _build(s, "snapshot.layer", LayerBuild.of(
                tag=req.tag, parent_tag=req.from_tag, run=tuple(req.warm_run), imports=tuple(req.warm_imports),
                code=tuple(req.warm_exec), labels=req.labels), wait)
        extra = {"boot_timeout": req.boot_wait_secs} if req.boot_wait_secs else {}
        return _build(s, "snapshot.parent", ParentBuild.of(
            tag=req.tag, memory_mib=req.memory_mib, vcpus=req.vcpus, warm_imports=tuple(req.warm_imports),
            warm_run=tuple(req.warm_run), warm_exec=tuple(req.warm_exec), labels=req.labels, **extra), wait)

    @r.post("/v1/snapshots/{tag}/compact", status_code=201, response_model=SnapshotView, responses=JOB)
    def compact_to(tag: str, req: wire.CompactRequest, wait: bool = Query(True, description=UPSTREAM_WAIT)) -> Any:
        """Upstream's compaction: write the chain head `tag` as a new base snapshot `to`."""
        return _build(s, "snapshot.compaction", Compaction.of(from_tag=tag, to_tag=req.to), wait)


def _build_routes(r: APIRouter, s: Service) -> None:
    done = {201: {"model": SnapshotView, "description": "wait=true: the snapshot, once built"}}

    @r.post("/v1/snapshots/build/parent", status_code=202, response_model=wire.Job, responses=done)
    def build_parent(req: ParentBuild, wait: bool = Query(False, description=WAIT)) -> Any:
        """`forkd snapshot`: boot, warm and pause a parent (forkd's build request), as a job."""
        return _build(s, "snapshot.parent", req, wait)

    @r.post("/v1/snapshots/build/layer", status_code=202, response_model=wire.Job, responses=done)
    def build_layer(req: LayerBuild, wait: bool = Query(False, description=WAIT)) -> Any:
        """`forkd snapshot diff`: a layer of the pages some steps change on `parent_tag`, as a job."""
        return _build(s, "snapshot.layer", req, wait)

    @r.post("/v1/snapshots/build/compaction", status_code=202, response_model=wire.Job, responses=done)
    def build_compaction(req: Compaction, wait: bool = Query(False, description=WAIT)) -> Any:
        """`forkd snapshot compact`: a chain head written as a base snapshot, as a job."""
        return _build(s, "snapshot.compaction", req, wait)

    @r.post("/v1/snapshots/build/from-image", status_code=202, response_model=wire.Job,
            responses={201: {"description": "wait=true: the snapshot's view and its image"}})
    def from_image(req: wire.FromImageRequest, wait: bool = Query(False, description=WAIT)) -> Any:
        """`forkd from-image`: build the image for an OCI reference and snapshot it, as a job (its result: the
        snapshot's view and the image)."""
        return _build(s, "snapshot.from-image", req, wait)
    _image_routes(r, s)


def _image_routes(r: APIRouter, s: Service) -> None:
    done = {200: {"description": "wait=true: the image, once built"}}

    @r.post("/v1/images/build", tags=["images"], status_code=202, response_model=wire.Job, responses=done)
    def build_image(req: wire.ImageBuildRequest | None = Body(None),
                    wait: bool = Query(False, description=WAIT)) -> Any:
        """`forkd image build`: the base guest image (cached unless `force`), as a job."""
        return _build(s, "image.build", req, wait, done=200)

    @r.post("/v1/images/debian", tags=["images"], status_code=202, response_model=wire.Job, responses=done)
    def build_debian(req: wire.DebianBuildRequest, wait: bool = Query(False, description=WAIT)) -> Any:
        """`forkd image build --debian-packages`: a guest image from Debian packages (cached unless `force`), as
        a job."""
        return _build(s, "image.debian", req, wait, done=200)


def deprecated_aliases(r: APIRouter) -> APIRouter:
    """`r` with each of `ALIASES` mounted as its native route's endpoint again, marked deprecated: one handler,
    so an old URL cannot answer differently from the new one, except that an old build URL blocks unless
    `?wait=false` (its clients expect the snapshot, not a job)."""
    native = {(m, route.path): route for route in r.routes if isinstance(route, APIRoute) for m in route.methods}
    for (method, old), key in ALIASES.items():
        route = native[key]
        endpoint = _waiting(route.endpoint)
        waits = endpoint is not route.endpoint
        blocks = " It blocks until the build is done unless `?wait=false`." if waits else ""
        status = next(c for c in route.responses if c != 202) if waits else route.status_code  # what it built
        r.add_api_route(
            old, endpoint, methods=[method], name=f"deprecated_{route.name}", deprecated=True,
            tags=["deprecated"], response_model=None if waits else route.response_model, status_code=status,
            responses={**route.responses, **JOB} if waits else route.responses, summary=route.summary,
            description=f"Deprecated: use `{key[0]} {key[1]}`.{blocks} {route.description}")
    return r


def _waiting(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint` with its `wait` query parameter (if it has one) true unless the caller says otherwise."""
    sig = inspect.signature(endpoint)
    if "wait" not in sig.parameters:
        return endpoint

    @functools.wraps(endpoint)
    def blocking(*args: Any, **kw: Any) -> Any:
        return endpoint(*args, **kw)

    wait = sig.parameters["wait"]
    blocking.__signature__ = sig.replace(parameters=[  # type: ignore[attr-defined]
        wait.replace(default=Query(True, description=UPSTREAM_WAIT)) if p is wait else p
        for p in sig.parameters.values()])
    return blocking


def _refuse_upstream_build(req: wire.CreateSnapshotRequest) -> None:
    """Upstream's create_snapshot fields forkd cannot honour: 422 with the reason, never a default image."""
    bad = [f"{k}: {why}" for k, why in UPSTREAM_REFUSED.items() if getattr(req, k) is not None]
    if req.rw is False:
        bad.append("rw: false: every forkd child writes to its own private copy of the disk; a read-only root "
                   "is not offered")
    if bad:
        raise Unprocessable("; ".join(bad), hint="drop these fields; see README (upstream's create_snapshot)")
