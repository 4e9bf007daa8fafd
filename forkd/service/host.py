"""The node through the service: capacity, gc, doctor, the audit log's check, start-up recovery, and moving
snapshot chains (packs, the hub); paths are on the host the service runs on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]
log = logging.getLogger("forkd.daemon")  # recover() is the daemon's start-up


def _quiet(_: str) -> None:
    pass


class Host:
    """The node verbs of forkd.service.service.Service (`self.rt`: the node's Runtime)."""

    rt: Any
    jobs: Any  # forkd.service.jobs.Jobs

    def capacity(self) -> dict[str, Any]:
        """What this node offers children, for placement (memory available, children running per pool)."""
        from forkd.core.capacity import node_capacity

        return node_capacity(self.rt)

    def gc(self, dry_run: bool = False, grace: float | None = None) -> dict[str, Any]:
        return self.rt.gc(dry_run=dry_run, grace=grace)

    def doctor(self, reprobe: bool = False, progress: Progress = _quiet) -> list[dict[str, Any]]:
        from forkd.core.doctor import run_checks

        return [c.__dict__ for c in run_checks(self.rt, reprobe=reprobe, progress=progress)]

    def audit_verify(self) -> dict[str, Any]:
        from forkd.core.audit import verify

        verdict = verify(self.rt.layout.home)
        return {"ok": verdict.ok, "text": str(verdict), "lines": verdict.lines, "bad_line": verdict.bad_line}

    def recover(self) -> None:
        """At a daemon's start: fail snapshots whose writer died and jobs the daemon before left unfinished, reap
        what dead processes left, adopt the children still running."""
        failed = self.rt.recover()
        if failed:
            log.warning("marked snapshots left writing by a crash as failed: %s", ", ".join(failed))
        ended = self.jobs.recover()
        if ended:
            log.warning("marked jobs left running or queued by the daemon before as failed: %s", ", ".join(ended))
        try:  # dead makers' temporaries; live recorded children adopted; dead ones and orphaned namespaces, veths,
            # cgroups, VMMs reaped
            rep = self.rt.gc()
            if rep["leftovers"]:
                log.warning("gc at start-up removed %d leftovers: %s", rep["leftovers"],
                            {k: len(v) for k, v in rep.items() if isinstance(v, list) and v and k != "adopted"})
        except Exception:  # noqa: BLE001 - a failed sweep must not keep the daemon down; doctor reports leftovers
            log.exception("gc at start-up failed")
        adopted = [c.id for c in self.rt.children() if c.status == "running"]
        log.info("adopted %d running children", len(adopted))

    # -- moving snapshot chains --------------------------------------------------------------------
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

    def snapshot_push(self, req: Any, progress: Progress = _quiet) -> dict[str, Any]:
        """Pack a chain and push it to an OCI registry as an artifact (forkd.core.pack.oci)."""
        from forkd.core.pack.oci import push

        return push(self.rt, req.tag, req.ref, _registry(req.registry), progress, level=req.level, owned=req.owned)

    def snapshot_pull(self, req: Any, progress: Progress = _quiet) -> dict[str, Any]:
        """Pull a snapshot artifact from an OCI registry, verify every digest and unpack it."""
        from forkd.core.pack.oci import pull

        return pull(self.rt, req.ref, _registry(req.registry), progress, owned=req.owned)


def _registry(reg: Any) -> Any:
    """The wire's RegistryPull as forkd.image.registry's options (None: skopeo's defaults, verified TLS)."""
    from forkd.image.registry import RegistryOptions

    return RegistryOptions(**reg.model_dump()) if reg is not None else None
