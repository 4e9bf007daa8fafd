"""LocalBackend: every verb in this process, on the caller's own Runtime and Control (forkd.core, the reconciler).

Results are plain JSON data (the shapes `forkd ... -o json` prints), the same the daemon's forkd-native routes
return, because those routes call this class: a verb answers alike in-process and through a daemon.
The snapshot and child producers take the core's typed requests (forkd.core.requests), validated once there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from forkd.base.errors import Unavailable
from forkd.client.wire import child_view, snapshot_view
from forkd.core.requests import Branch, Compaction, Egress, LayerBuild, ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class LocalBackend:
    """In-process: the caller's own Control (and, for `wait`, its own reconcile loop)."""

    is_local = True  # paths it returns (agent sockets, files) are on this host

    def __init__(self, control: Control | None = None):
        self.control = control or Control(Runtime())

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
        return [child_view(r) for r in self.control.claim(pool, n, lifetime=lifetime)]

    def wait(self, targets, timeout, progress=_quiet):
        return self.control.reconciler.run_until_converged(timeout, targets, progress)

    # -- images --------------------------------------------------------------------------------------
    def build_image(self, force: bool = False, progress: Progress = _quiet) -> dict[str, Any]:
        image, built = self.rt.build_image(progress, force=force)
        return dict(image.meta, built_now=built, path=str(image.dir))

    def build_debian(self, packages: list[str], suite: str | None = None, force: bool = False,
                     rootfs: str = "auto", progress: Progress = _quiet) -> dict[str, Any]:
        from forkd.core.images import build_debian

        image, built = build_debian(self.rt, packages, suite, progress=progress, force=force, rootfs=rootfs)
        return dict(image.meta, built_now=built, path=str(image.dir))

    def from_image(self, ref: str, tag: str, memory_mib: int = 512, vcpus: int = 1, warm_imports: list[str] = (),
                   warm_run: list[str] = (), pip: list[str] = (), apt: list[str] = (), rootfs: str = "auto",
                   progress: Progress = _quiet, registry: dict[str, Any] | None = None) -> dict[str, Any]:
        from forkd.core.images import from_image

        snap, image, built = from_image(self.rt, ref, tag, memory_mib, vcpus, tuple(warm_imports), tuple(warm_run),
                                        pip=tuple(pip), apt=tuple(apt), progress=progress, rootfs=rootfs,
                                        registry=registry)
        return dict(snap.to_json(), image=dict(image.meta, built_now=built))

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshots(self) -> list[dict[str, Any]]:
        return [snapshot_view(s) for s in self.rt.snapshots()]

    def snapshot_info(self, tag: str) -> dict[str, Any]:
        return self.rt.snapshot_info(tag)

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet) -> dict[str, Any]:
        return self.rt.create_snapshot(req, progress=progress).to_json()

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet) -> dict[str, Any]:
        return self.rt.snapshot_diff(req, progress=progress).to_json()

    def compact(self, req: Compaction, progress: Progress = _quiet) -> dict[str, Any]:
        return self.rt.compact(req, progress=progress).to_json()

    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]:
        return self.rt.rmi(tag, force=force, cascade=cascade)

    # -- children ------------------------------------------------------------------------------------
    def children(self, labels: list[str] | None = None) -> list[dict[str, Any]]:
        from forkd.core.lifetimes import matches, parse_selector

        sel = parse_selector(labels)
        return [child_view(r) for r in self.rt.children() if matches(r.labels, sel)]

    def set_timeout(self, child: str, seconds: float) -> dict[str, Any]:
        """Keepalive: `child` now expires `seconds` from now (enforced by a running daemon's sweeper)."""
        from forkd.core.lifetimes import set_timeout

        return child_view(set_timeout(self.rt, child, seconds))

    def port(self, child: str, port: int, close: bool = False) -> dict[str, Any]:
        """Ports are served by a running daemon (its grants live in its memory): refused here."""
        raise Unavailable(f"opening port {port} of {child} needs the daemon: it serves the port's URL",
                          hint="start it with 'forkd serve' (add --bind HOST:PORT --token-file F for TCP), or set "
                               "FORKD_URL/FORKD_TOKEN to one that runs")

    def fork_from(self, child: str, n: int = 1, tag: str | None = None, keep: bool = False,
                  lifetime: float | None = None, egress: Egress | None = None) -> list[dict[str, Any]]:
        """`n` children continuing from this instant of `child` (forkd.core.forking); egress None: the source's."""
        from forkd.core.forking import fork

        return [child_view(r) for r in fork(self.rt, child, n, tag=tag, keep=keep, lifetime=lifetime,
                                            egress=egress)[1]]

    def fork(self, req: Spawn, progress: Progress = _quiet) -> list[dict[str, Any]]:
        return [child_view(r) for r in self.rt.fork(req, progress=progress)]

    def exec(self, child: str, argv: list[str], cwd: str | None = None, timeout: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> dict[str, Any]:
        return self.rt.exec(child, argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout)

    def eval(self, child: str, code: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.rt.eval(child, code, timeout=timeout)

    def files(self, child: str):
        """The files of a child (forkd.client.files.LocalFiles: list, stat, read/write streams, tar, watch)."""
        from forkd.client.files import LocalFiles

        return LocalFiles(self.rt, child)

    def ping(self, child: str) -> dict[str, Any]:
        return self.rt.ping(child)

    def kill(self, ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> list[list]:
        return [[cid, was_running] for cid, was_running in self.rt.kill(ids, all_=all_, tag=tag)]

    def branch(self, req: Branch) -> dict[str, Any]:
        return self.rt.branch(req).to_json()

    def settle(self, tag: str) -> dict[str, Any] | None:
        """After a `wait=False` branch: wait for this process's background conversion; the snapshot as it ended."""
        from forkd.core.branch import wait_background

        wait_background(self.rt)
        return self.rt.store.get(tag).to_json()

    # -- this host -----------------------------------------------------------------------------------
    def gc(self, dry_run: bool = False, grace: float | None = None) -> dict[str, Any]:
        return self.rt.gc(dry_run=dry_run, grace=grace)

    def doctor(self, reprobe: bool = False, progress: Progress = _quiet) -> list[dict[str, Any]]:
        from forkd.core.doctor import run_checks

        return [c.__dict__ for c in run_checks(self.rt, reprobe=reprobe, progress=progress)]

    def audit_verify(self) -> dict[str, Any]:
        from forkd.core.audit import verify

        verdict = verify(self.rt.layout.home)
        return {"ok": verdict.ok, "text": str(verdict), "lines": verdict.lines, "bad_line": verdict.bad_line}

    # -- moving snapshot chains (paths are on the host this backend runs on) --------------------------
    def pack(self, tag: str, path: str, level: int = 3, progress: Progress = _quiet) -> dict[str, Any]:
        from forkd.core.pack import pack

        return pack(self.rt, tag, Path(path), progress, level=level)

    def unpack(self, path: str, progress: Progress = _quiet) -> dict[str, Any]:
        from forkd.core.pack import unpack

        return unpack(self.rt, Path(path), progress)

    def pull(self, ref: str, hub: str | None = None, progress: Progress = _quiet,
             on_bytes: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        from forkd.core.hub import pull

        return pull(self.rt, ref, hub, progress, on_bytes=on_bytes or (lambda *_: None))

    def push(self, tag: str, ref: str, hub: str | None = None, force: bool = False,
             progress: Progress = _quiet) -> dict[str, Any]:
        from forkd.core.hub import push

        return push(self.rt, tag, ref, hub, progress, force=force)
