"""Snapshot routes: upstream's `/v1/snapshots` (answers forkd.service.wire's SnapshotInfo) and forkd's own
`/v1/manifests` and `/v1/build/*` (the CLI's RemoteBackend: LocalBackend's JSON). Each handler parses and calls
the service (forkd.service.Service); paths in bodies (OCI layouts) are on the daemon's host.

  GET  /v1/manifests[/{tag}]   snapshots / snapshot-info        DELETE /v1/manifests/{tag}   rmi
  POST /v1/build/parent|layer|compaction   snapshot create / snapshot-diff / snapshot-compact
  POST /v1/build/image|debian|from-image   image build / from-image
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Response

from forkd.base.errors import InvalidInput
from forkd.core.requests import Compaction, LayerBuild, ParentBuild
from forkd.service import Service, wire

UPSTREAM_REFUSED = {
    "kernel": "forkd boots its own guest kernel (virtio drivers, its agent as PID 1); a user kernel is not booted",
    "rootfs": "a user ext4 rootfs is not booted: forkd would have to read an untrusted filesystem to inject its "
              "agent, and it does not mount images; build from an OCI image instead (POST /v1/build/from-image, "
              "`forkd from-image`)",
    "tap": "forkd makes each child's network itself (per-child namespace and tap, spawn with per_child_netns); "
           "it does not attach a host tap you name",
}


class Unprocessable(InvalidInput):
    """A well-formed field forkd refuses to honour: 422."""

    http_status = 422


def build_snapshot_router(s: Service) -> APIRouter:
    r = APIRouter()
    _upstream_routes(r, s)
    _manifest_routes(r, s)
    _build_routes(r, s)
    return r


def _upstream_routes(r: APIRouter, s: Service) -> None:
    tags = ["snapshots"]

    @r.get("/v1/snapshots", tags=tags)
    def list_snapshots() -> list[wire.SnapshotInfo]:
        return s.snapshot_infos()

    @r.post("/v1/snapshots", status_code=201, tags=tags)
    def create_snapshot(req: wire.CreateSnapshotRequest) -> wire.SnapshotInfo:
        """Boot a parent, warm it and snapshot it (blocks until ready); with `from_tag`, build a diff layer.
        Upstream's `kernel`, `rootfs`, `tap` and `rw: false` are refused (422, with the reason); `boot_wait_secs`
        is the parent's boot timeout; `rw: true` is what every forkd child has (a private writable disk)."""
        _refuse_upstream_build(req)
        if req.from_tag:
            return s.info(s.snapshot_diff(LayerBuild.of(
                tag=req.tag, parent_tag=req.from_tag, run=tuple(req.warm_run), imports=tuple(req.warm_imports),
                code=tuple(req.warm_exec), labels=req.labels)))
        extra = {"boot_timeout": req.boot_wait_secs} if req.boot_wait_secs else {}
        return s.info(s.create_snapshot(ParentBuild.of(
            tag=req.tag, memory_mib=req.memory_mib, vcpus=req.vcpus, warm_imports=tuple(req.warm_imports),
            warm_run=tuple(req.warm_run), warm_exec=tuple(req.warm_exec), labels=req.labels, **extra)))

    @r.get("/v1/snapshots/{tag}", tags=tags)
    def get_snapshot(tag: str) -> wire.SnapshotInfo:
        return s.snapshot(tag)

    @r.get("/v1/snapshots/{tag}/info", tags=tags)
    def snapshot_info(tag: str) -> wire.SnapshotDetail:
        return s.snapshot_detail(tag)

    @r.delete("/v1/snapshots/{tag}", status_code=204, tags=tags)
    def delete_snapshot(tag: str, cascade: bool = False, force: bool = False) -> Response:
        """409 while children of it run or layers depend on it (named), unless `cascade` or `force`."""
        s.rmi(tag, force=force, cascade=cascade)
        return Response(status_code=204)

    @r.post("/v1/snapshots/{tag}/compact", status_code=201, tags=tags)
    def compact(tag: str, req: wire.CompactRequest) -> wire.SnapshotInfo:
        return s.info(s.compact(Compaction.of(from_tag=tag, to_tag=req.to)))


def _manifest_routes(r: APIRouter, s: Service) -> None:
    @r.get("/v1/manifests", tags=["forkd"])
    def snapshots() -> list[dict[str, Any]]:
        return [wire.snapshot_view(x) for x in s.snapshots()]

    @r.get("/v1/manifests/{tag}", tags=["forkd"])
    def snapshot_info(tag: str) -> dict[str, Any]:
        return s.snapshot_info(tag)

    @r.delete("/v1/manifests/{tag}", tags=["forkd"])
    def rmi(tag: str, force: bool = False, cascade: bool = False) -> dict[str, Any]:
        return {"deleted": s.rmi(tag, force=force, cascade=cascade)}


def _build_routes(r: APIRouter, s: Service) -> None:
    @r.post("/v1/build/parent", status_code=201, tags=["forkd"])
    def create_snapshot(req: ParentBuild) -> dict[str, Any]:
        return s.create_snapshot(req).to_json()

    @r.post("/v1/build/layer", status_code=201, tags=["forkd"])
    def snapshot_diff(req: LayerBuild) -> dict[str, Any]:
        return s.snapshot_diff(req).to_json()

    @r.post("/v1/build/compaction", status_code=201, tags=["forkd"])
    def compact(req: Compaction) -> dict[str, Any]:
        return s.compact(req).to_json()

    @r.post("/v1/build/image", tags=["forkd"])
    def build_image(req: wire.ImageBuildRequest | None = Body(None)) -> dict[str, Any]:
        return s.build_image(force=bool(req and req.force))

    @r.post("/v1/build/debian", tags=["forkd"])
    def build_debian(req: wire.DebianBuildRequest) -> dict[str, Any]:
        return s.build_debian(req)

    @r.post("/v1/build/from-image", status_code=201, tags=["forkd"])
    def from_image(req: wire.FromImageRequest) -> dict[str, Any]:
        return s.from_image(req)


def _refuse_upstream_build(req: wire.CreateSnapshotRequest) -> None:
    """Upstream's create_snapshot fields forkd cannot honour: 422 with the reason, never a default image."""
    bad = [f"{k}: {why}" for k, why in UPSTREAM_REFUSED.items() if getattr(req, k) is not None]
    if req.rw is False:
        bad.append("rw: false: every forkd child writes to its own private copy of the disk; a read-only root "
                   "is not offered")
    if bad:
        raise Unprocessable("; ".join(bad), hint="drop these fields; see README (upstream's create_snapshot)")
