"""Snapshots and images through the service: list, describe, build (parent, layer, compaction, images), remove.
Upstream's `/v1/snapshots` and forkd's `/v1/manifests`, `/v1/build/*` and LocalBackend call these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forkd.core.requests import Compaction, LayerBuild, ParentBuild
from forkd.service import wire

Progress = Callable[[str], None]
DETAIL_KEYS = ("depth", "ancestors", "dependents", "children", "logical_bytes", "stored_bytes", "chain_ok",
               "chain_error", "materialized", "memory_sha256", "diff_pages", "warm_imports", "qemu_version")


def _quiet(_: str) -> None:
    pass


class Snapshots:
    """The snapshot and image verbs of forkd.service.service.Service (`self.rt`: the node's Runtime)."""

    rt: Any

    def snapshots(self) -> list:
        """Every snapshot's manifest, and an error entry for one that cannot be read."""
        return self.rt.snapshots()

    def info(self, snap: Any) -> wire.SnapshotInfo:
        """A snapshot as the `/v1/snapshots` routes answer it."""
        return wire.snapshot_info(snap, str(self.rt.store.dir(snap.tag)))

    def snapshot_infos(self) -> list[wire.SnapshotInfo]:
        return [self.info(s) for s in self.rt.snapshots() if hasattr(s, "tag")]

    def snapshot(self, tag: str) -> wire.SnapshotInfo:
        return self.info(self.rt.store.get(tag))

    def snapshot_info(self, tag: str) -> dict[str, Any]:
        """`forkd snapshot-info`: chain, dependents, sizes, hashes."""
        return self.rt.snapshot_info(tag)

    def snapshot_detail(self, tag: str) -> wire.SnapshotDetail:
        """The manifest and its chain (upstream's `/v1/snapshots/{tag}/info`)."""
        info = self.rt.snapshot_info(tag)
        base = self.snapshot(tag).model_dump()
        base.update({k: info.get(k) for k in DETAIL_KEYS if k in info})
        return wire.SnapshotDetail(**base)

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet) -> Any:
        return self.rt.create_snapshot(req, progress=progress)

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet) -> Any:
        return self.rt.snapshot_diff(req, progress=progress)

    def compact(self, req: Compaction, progress: Progress = _quiet) -> Any:
        return self.rt.compact(req, progress=progress)

    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]:
        """409 while children run on it or layers depend on it (named), unless `cascade` or `force`."""
        return self.rt.rmi(tag, force=force, cascade=cascade)

    # -- images --------------------------------------------------------------------------------------
    def build_image(self, force: bool = False, progress: Progress = _quiet) -> dict[str, Any]:
        image, built = self.rt.build_image(progress, force=force)
        return dict(image.meta, built_now=built, path=str(image.dir))

    def build_debian(self, req: wire.DebianBuildRequest, progress: Progress = _quiet) -> dict[str, Any]:
        from forkd.core.images import build_debian

        image, built = build_debian(self.rt, req.packages, req.suite, progress=progress, force=req.force,
                                    rootfs=req.rootfs)
        return dict(image.meta, built_now=built, path=str(image.dir))

    def from_image(self, req: wire.FromImageRequest, progress: Progress = _quiet) -> dict[str, Any]:
        """Build the image for `req.ref` (cached) and boot, warm and snapshot it as `req.tag`."""
        from forkd.core.images import from_image

        snap, image, built = from_image(self.rt, req.ref, req.tag, req.memory_mib, req.vcpus,
                                        tuple(req.warm_imports), tuple(req.warm_run), pip=tuple(req.pip),
                                        apt=tuple(req.apt), progress=progress, rootfs=req.rootfs,
                                        registry=req.registry.model_dump() if req.registry else None)
        return dict(snap.to_json(), image=dict(image.meta, built_now=built))
