"""LocalBackend: every verb in this process, through the service the daemon's routes call (forkd.service.Service,
on the caller's own Runtime and Control), so a verb means the same in-process and through a daemon (a fork's
lifetime, an unnamed branch's label, the release of a fork's snapshot).

Results are the service's typed views and wire models (forkd.service.listing, forkd.service.wire) or plain JSON
data (the shapes `forkd ... -o json` prints), the same the daemon's native routes return.
The snapshot and child producers take the core's typed requests (forkd.core.requests), validated once there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forkd.base.errors import Unavailable
from forkd.core.requests import Branch, Compaction, Egress, LayerBuild, ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.service import wire
from forkd.service.listing import ChildView, SnapshotView
from forkd.service.service import Service

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class LocalBackend:
    """In-process: the caller's own Control (and, for `wait`, its own reconcile loop)."""

    is_local = True  # paths it returns (agent sockets, files) are on this host

    def __init__(self, control: Control | None = None):
        self.service = Service(control)
        self.control = self.service.control

    @property
    def rt(self) -> Runtime:
        return self.control.rt

    # -- declarative objects -------------------------------------------------------------------------
    def apply(self, objs, applyset, prune=False, dry_run=False, manager="cli", force=False):
        return self.control.apply(objs, applyset, prune=prune, dry_run=dry_run, manager=manager, force=force)

    def diff(self, objs):
        return self.control.diff(objs)

    def get(self, kind, name=None):
        return self.control.get(kind, name)

    def describe(self, kind, name):
        return self.control.describe(kind, name)

    def delete(self, kind, name):
        self.control.delete(kind, name)

    def claim(self, pool, n=1, lifetime=None):
        return self.service.claim(pool, n, lifetime=lifetime)

    def wait(self, targets, timeout, progress=_quiet):
        return self.control.reconciler.run_until_converged(timeout, targets, progress)

    # -- images --------------------------------------------------------------------------------------
    def build_image(self, force: bool = False, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.build_image(force=force, progress=progress)

    def build_debian(self, req: wire.DebianBuildRequest, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.build_debian(req, progress=progress)

    def from_image(self, req: wire.FromImageRequest, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.from_image(req, progress=progress)

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshots(self) -> list[SnapshotView]:
        return self.service.snapshots()

    def snapshot_info(self, tag: str) -> dict[str, Any]:
        return self.service.snapshot_detail(tag).model_dump(mode="json")

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet) -> SnapshotView:
        return self.service.create_snapshot(req, progress=progress)

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet) -> SnapshotView:
        return self.service.snapshot_diff(req, progress=progress)

    def compact(self, req: Compaction, progress: Progress = _quiet) -> SnapshotView:
        return self.service.compact(req, progress=progress)

    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]:
        return self.service.rmi(tag, force=force, cascade=cascade)

    # -- children ------------------------------------------------------------------------------------
    def children(self, labels: list[str] | None = None) -> list[ChildView]:
        return self.service.children(labels)

    def child(self, child_id: str) -> ChildView:
        return self.service.view(child_id)

    def set_timeout(self, child: str, seconds: float) -> ChildView:
        """Keepalive: `child` now expires `seconds` from now (enforced by a running daemon's sweeper)."""
        return self.service.set_timeout(child, seconds)

    def port(self, child: str, port: int, close: bool = False) -> dict[str, Any]:
        """Ports are served by a running daemon (it answers their URLs): refused here."""
        raise Unavailable(f"opening port {port} of {child} needs the daemon: it serves the port's URL",
                          hint="start it with 'forkd serve' (add --bind HOST:PORT --token-file F for TCP), or set "
                               "FORKD_URL/FORKD_TOKEN to one that runs")

    def fork_from(self, child: str, n: int = 1, tag: str | None = None, keep: bool = False,
                  lifetime: float | None = None, egress: Egress | None = None) -> list[ChildView]:
        """`n` children continuing from this instant of `child`; egress None: the source's."""
        return self.service.fork_from(child, n, tag=tag, keep=keep, lifetime=lifetime, egress=egress)[1]

    def fork(self, req: Spawn, progress: Progress = _quiet) -> list[ChildView]:
        """Hand-made children live FORKD_SANDBOX_TIMEOUT (enforced by a daemon's sweeper); pool children: none."""
        return self.service.spawn(req, progress=progress)

    def exec(self, child: str, argv: list[str], cwd: str | None = None, timeout: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> wire.ExecResult:
        return self.service.exec(child, argv, cwd=cwd, timeout=timeout, env=env, stdin=stdin)

    def eval(self, child: str, code: str, timeout: float = 60.0) -> wire.EvalAnswer:
        res = self.service.eval(child, code, timeout=timeout)
        return wire.EvalAnswer(value=res.get("value"), error=res.get("error"), stdout=res.get("stdout", ""))

    def files(self, child: str):
        """The files of a child (forkd.client.files.LocalFiles: list, stat, read/write streams, tar, watch)."""
        from forkd.client.files import LocalFiles

        return LocalFiles(self.rt, child)

    def ping(self, child: str) -> wire.PingResult:
        return self.service.ping(child)

    def kill(self, ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> list[list]:
        """Stop children; the snapshot of a fork(n) goes with the last of its children."""
        return [[cid, was_running] for cid, was_running in self.service.kill(ids, all_=all_, tag=tag)]

    def branch(self, req: Branch) -> wire.BranchAnswer:
        res = self.service.branch_request(req)
        return wire.BranchAnswer(snapshot=self.service.info(res.snapshot), source=res.source, mode=res.mode,
                                 pause_ms=res.pause_ms, returned_ms=res.returned_ms, capture=res.capture,
                                 capture_note=res.capture_note)

    def settle(self, tag: str) -> wire.SnapshotInfo | None:
        """After a `wait=False` branch: wait for this process's background conversion; the snapshot as it ended."""
        return self.service.info(self.service.settle(tag))

    # -- jobs: the records a daemon left in this home (in-process builds are not jobs) ---------------
    def jobs(self) -> list[dict[str, Any]]:
        return [j.model_dump(mode="json") for j in self.service.jobs.list()]

    def job(self, job_id: str, wait_secs: float = 0.0, since: int | None = None) -> dict[str, Any]:
        return self.service.jobs.wait(job_id, wait_secs, since).model_dump(mode="json")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self.service.jobs.cancel(job_id).model_dump(mode="json")

    # -- this host -----------------------------------------------------------------------------------
    def gc(self, dry_run: bool = False, grace: float | None = None) -> dict[str, Any]:
        return self.service.gc(dry_run=dry_run, grace=grace)

    def doctor(self, reprobe: bool = False, progress: Progress = _quiet) -> list[dict[str, Any]]:
        return self.service.doctor(reprobe=reprobe, progress=progress)

    def audit_verify(self) -> dict[str, Any]:
        return self.service.audit_verify()

    # -- moving snapshot chains (paths are on the host this backend runs on) --------------------------
    def pack(self, tag: str, path: str, level: int = 3, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.pack(tag, path, level=level, progress=progress)

    def unpack(self, path: str, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.unpack(path, progress=progress)

    def pull(self, ref: str, hub: str | None = None, progress: Progress = _quiet,
             on_bytes: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        return self.service.pull(ref, hub, progress=progress, on_bytes=on_bytes)

    def push(self, tag: str, ref: str, hub: str | None = None, force: bool = False,
             progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.push(tag, ref, hub, force=force, progress=progress)

    def snapshot_push(self, req: wire.SnapshotPushRequest, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.snapshot_push(req, progress=progress)

    def snapshot_pull(self, req: wire.SnapshotPullRequest, progress: Progress = _quiet) -> dict[str, Any]:
        return self.service.snapshot_pull(req, progress=progress)
