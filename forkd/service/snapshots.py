"""Snapshots and images through the service: list, describe, build (parent, layer, compaction, images), remove.
The `/v1/snapshots` and `/v1/images` routes and LocalBackend call these; a snapshot answers as its typed view
(forkd.service.listing.SnapshotView), which is also upstream's SnapshotInfo. Through the daemon a build is a job
(`build_job`, forkd.service.jobs) whose result is what the verb answers, as JSON.

Every build verb takes a cancel token (forkd.base.cancel; a job's, so DELETE /v1/jobs/{id} stops it): its progress
lines become points where it stops, and a snapshot build checks it between its steps and stops its VMM when it is
set (forkd.core.pipeline.job). An image build stops at its next progress line only: a host tool it runs (mmdebstrap,
skopeo, pip, cpio) finishes first; its work directory is removed on the way out, as on any failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forkd.base.cancel import CancelToken, checking
from forkd.core.requests import Compaction, LayerBuild, ParentBuild
from forkd.service import wire
from forkd.service.listing import SnapshotView
from forkd.service.wire import Job

Progress = Callable[[str], None]
# a build's kind -> (the verb that runs it, what it builds: a snapshot's tag)
BUILDS: dict[str, tuple[str, Callable[[Any], str | None]]] = {
    "snapshot.parent": ("create_snapshot", lambda req: req.tag),
    "snapshot.layer": ("snapshot_diff", lambda req: req.tag),
    "snapshot.compaction": ("compact", lambda req: req.to_tag),
    "snapshot.from-image": ("from_image", lambda req: req.tag),
    "image.build": ("build_image_req", lambda req: None),
    "image.debian": ("build_debian", lambda req: None),
}


def _quiet(_: str) -> None:
    pass


class Snapshots:
    """The snapshot and image verbs of forkd.service.service.Service (`self.rt`: the node's Runtime)."""

    rt: Any
    jobs: Any  # forkd.service.jobs.Jobs

    def build_job(self, kind: str, req: Any) -> Job:
        """Start a build (`kind` one of BUILDS, `req` its request) as a job; its result is the verb's answer."""
        verb, target = BUILDS[kind]
        run = getattr(self, verb)
        return self.jobs.submit(kind, lambda progress, cancel: _as_json(run(req, progress=progress, cancel=cancel)),
                                target=target(req))

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

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet,
                        cancel: CancelToken | None = None) -> SnapshotView:
        return self.snap_view(self.rt.create_snapshot(req, progress=checking(progress, cancel), cancel=cancel))

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet,
                      cancel: CancelToken | None = None) -> SnapshotView:
        return self.snap_view(self.rt.snapshot_diff(req, progress=checking(progress, cancel), cancel=cancel))

    def compact(self, req: Compaction, progress: Progress = _quiet,
                cancel: CancelToken | None = None) -> SnapshotView:
        return self.snap_view(self.rt.compact(req, progress=checking(progress, cancel), cancel=cancel))

    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]:
        """409 while children run on it or layers depend on it (named), unless `cascade` or `force`."""
        return self.rt.rmi(tag, force=force, cascade=cascade)

    # -- images --------------------------------------------------------------------------------------
    def build_image(self, force: bool = False, progress: Progress = _quiet,
                    cancel: CancelToken | None = None) -> dict[str, Any]:
        image, built = self.rt.build_image(checking(progress, cancel), force=force)
        return dict(image.meta, built_now=built, path=str(image.dir))

    def build_image_req(self, req: wire.ImageBuildRequest | None, progress: Progress = _quiet,
                        cancel: CancelToken | None = None) -> dict[str, Any]:
        return self.build_image(force=bool(req and req.force), progress=progress, cancel=cancel)

    def build_debian(self, req: wire.DebianBuildRequest, progress: Progress = _quiet,
                     cancel: CancelToken | None = None) -> dict[str, Any]:
        from forkd.core.images import build_debian

        image, built = build_debian(self.rt, req.packages, req.suite, progress=checking(progress, cancel),
                                    force=req.force, rootfs=req.rootfs)
        return dict(image.meta, built_now=built, path=str(image.dir))

    def from_image(self, req: wire.FromImageRequest, progress: Progress = _quiet,
                   cancel: CancelToken | None = None) -> dict[str, Any]:
        """Build the image for `req.ref` (cached) and boot, warm and snapshot it as `req.tag`."""
        from forkd.core.images import from_image

        snap, image, built = from_image(self.rt, req.ref, req.tag, req.memory_mib, req.vcpus,
                                        tuple(req.warm_imports), tuple(req.warm_run), pip=tuple(req.pip),
                                        apt=tuple(req.apt), progress=checking(progress, cancel), rootfs=req.rootfs,
                                        registry=req.registry.model_dump() if req.registry else None, cancel=cancel)
        return dict(self.snap_view(snap).to_json(), image=dict(image.meta, built_now=built))


def _as_json(answer: Any) -> Any:
    """A verb's answer as a job holds it: a view's JSON, a dict as it is."""
    return answer.to_json() if isinstance(answer, SnapshotView) else answer
