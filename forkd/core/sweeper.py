"""The node's idle loop (the sweeper), owned by its runtime (`Runtime.start_sweeper`; the daemon starts it): a
thread that enforces sandbox lifetimes and the branch-snapshot policy
(forkd.core.lifetimes.sweep) every FORKD_SWEEP_INTERVAL seconds, so a sandbox dies on time even if the caller that
made it vanished. Each expiry is an audit event (`sweeper expire <id>`). The same pass pages out children idle
FORKD_IDLE_PAGEOUT_SECS (60 s; 0 = never), to zram only by default (forkd.core.idle), and once a minute hands the
memory the daemon's threads freed back to the kernel (forkd.base.heap)."""

from __future__ import annotations

import logging
import threading
import time

from forkd.base import heap
from forkd.base.settings import settings
from forkd.core.audit import AuditLog
from forkd.core.idle import IdleReclaimer
from forkd.core.lifetimes import sweep

log = logging.getLogger(__name__)
TRIM_EVERY_S = 60.0  # malloc_trim walks every arena: once a minute is enough for a slope measured per minute


def _record(audit: AuditLog | None, action: str, target: str, **extra) -> None:
    if audit is None:
        return
    try:
        audit.append("sweeper", action, target, "ok", 0.0, **extra)
    except Exception:  # noqa: BLE001 - fail-open like the reconciler's hook: the sweep goes on
        log.exception("audit append failed for %s %s", action, target)


def run(rt, stop: threading.Event, audit: AuditLog | None = None) -> None:
    idle = IdleReclaimer(settings().idle_pageout_secs)
    trimmed = time.monotonic()
    while not stop.is_set():
        s = settings()
        if time.monotonic() - trimmed >= TRIM_EVERY_S:  # memory the daemon's threads freed goes back to the kernel
            heap.trim()
            trimmed = time.monotonic()
        try:
            for cid, paged in idle.tick(rt).items():
                log.info("paged out idle child %s: %d KiB of its VMM to swap", cid, paged.moved_kib)
        except Exception:  # noqa: BLE001 - as below: the sweep goes on
            log.exception("idle page-out failed")
        try:
            out = sweep(rt, branch_ttl=s.branch_ttl,
                        on_expire=lambda r: _record(audit, "expire", r.id, expires_at=r.expires_at))
            for tag in out.removed:
                _record(audit, "rmi", tag)
        except Exception:  # noqa: BLE001 - the sweeper must survive anything one pass throws
            log.exception("sweep failed")
        rt.sweeps += 1  # this thread alone writes it
        stop.wait(s.sweep_interval)


def start(rt, stop: threading.Event, audit: AuditLog | None = None) -> threading.Thread:
    t = threading.Thread(target=run, args=(rt, stop, audit), name="forkd-sweeper", daemon=True)
    t.start()
    return t
