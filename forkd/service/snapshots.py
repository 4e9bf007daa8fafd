"""Snapshots and images through the service: list, describe, build (parent, layer, compaction, images), remove.
The `/v1/snapshots` and `/v1/images` routes and LocalBackend call these; a snapshot answers as its typed view
(forkd.service.listing.SnapshotView), which is also upstream's SnapshotInfo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forkd.core.requests import Compaction, LayerBuild, ParentBuild
from forkd.service import wire
from forkd.service.listing import SnapshotView

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class Snapshots:
    """The snapshot and image verbs of forkd.service.service.Service (`self.rt`: the node's Runtime)."""

    rt: Any

    def snapshots(self) -> list[SnapshotView]:
        """Every snapshot, and a `failed`, `corrupt` entry (named by its directory) for one that cannot be read."""
        return [self.snap_view(s) for s in self.rt.snapshots()]

    def snap_view(self, snap: Any) -> SnapshotView:
        """A snapshot record as every door lists it (its directory is on this host)."""
        name = getattr(snap, "tag", None) or getattr(snap, "dirname", None)  # a corrupt one's may be no tag
        return wire.snapshot_view(snap, str(self.rt.store.root / name) if name else None)

    def info(self, snap: Any) -> wire.SnapshotInfo:
        """A snapshot as upstream's SnapshotInfo (inside a branch's answer)."""
        return wire.snapshot_info(snap, str(self.rt.store.dir(snap.tag)))

    def snapshot(self, tag: str) -> SnapshotView:
        return self.snap_view(self.rt.store.get(tag))

    def snapshot_detail(self, tag: str) -> wire.SnapshotDetail:
        """`forkd snapshot info` and upstream's `/v1/snapshots/{tag}/info`: the snapshot's view, its chain,
        dependents, running children, sizes and hashes."""
        info = self.rt.snapshot_info(tag)
        return wire.SnapshotDetail(**dict(self.snapshot(tag).to_json(), **info))

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet) -> SnapshotView:
        return self.snap_view(self.rt.create_snapshot(req, progress=progress))

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet) -> SnapshotView:
        return self.snap_view(self.rt.snapshot_diff(req, progress=progress))

    def compact(self, req: Compaction, progress: Progress = _quiet) -> SnapshotView:
        return self.snap_view(self.rt.compact(req, progress=progress))

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
        return dict(self.snap_view(snap).to_json(), image=dict(image.meta, built_now=built))
