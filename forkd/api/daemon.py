"""`forkd serve`: the daemon that owns children and runs the reconcile loop, the API on a unix socket (0600), and
optionally a TCP listener (`--bind HOST:PORT`, bearer token from `--token-file`) and the GitOps directory watch.
Mutating API calls and reconciler actions are appended to the hash-chained audit log ($FORKD_HOME/audit.log).

Start-up recovers what a crash left: `writing` snapshots whose writer died are marked failed, half-built
temporary files are removed; running children are simply found in the registry and adopted by the loop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import uvicorn
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from forkd.api.auth import TagTransport, check_bind, load_or_create_token, parse_bind
from forkd.base.atomic import write_bytes
from forkd.base.paths import Layout
from forkd.core.audit import AuditLog
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.reconciler.engine import Reconciler
from forkd.reconciler.gitops import sync_directory

log = logging.getLogger("forkd.daemon")


class _Debounced(FileSystemEventHandler):
    """Collapse bursts of file events into one sync after `delay` seconds of quiet."""

    def __init__(self, fire, delay: float = 0.5):
        self.fire, self.delay = fire, delay
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()

    def on_any_event(self, event) -> None:
        if event.is_directory and event.event_type == "modified":
            return
        with self.lock:
            if self.timer:
                self.timer.cancel()
            self.timer = threading.Timer(self.delay, self.fire)
            self.timer.daemon = True
            self.timer.start()


def _recover(rt: Runtime) -> None:
    failed = rt.recover()
    if failed:
        log.warning("marked snapshots left writing by a crash as failed: %s", ", ".join(failed))
    for p in rt.layout.tmp.iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    try:  # adopt live recorded children; reap dead ones and orphaned namespaces, veths, cgroups, VMMs
        rep = rt.gc()
        if rep["leftovers"]:
            log.warning("gc at start-up removed %d leftovers: %s", rep["leftovers"],
                        {k: len(v) for k, v in rep.items() if isinstance(v, list) and v and k != "adopted"})
    except Exception:  # noqa: BLE001 - a failed sweep must not keep the daemon down; doctor reports leftovers
        log.exception("gc at start-up failed")
    adopted = [c.id for c in rt.children() if c.status == "running"]
    log.info("adopted %d running children", len(adopted))


def _restrict_socket(server: uvicorn.Server, sock: Path) -> None:
    """uvicorn makes its unix socket 0666; only the daemon's owner may drive it."""
    while not server.started and not server.should_exit:
        time.sleep(0.01)
    if sock.exists():
        os.chmod(sock, 0o600)


def _audit_hook(audit: AuditLog):
    def on_action(action, ok: bool, message: str, ms: float) -> None:
        audit.append("reconciler", type(action).__name__, action.key, "ok" if ok else "error", ms, message=message)
    return on_action


def _watch(control: Control, watch: Path) -> Observer:
    """Apply `watch` now and on every change (GitOps); returns the running observer."""
    def sync() -> None:
        try:
            report = sync_directory(control, watch)
            for f, e in report.errors.items():
                log.warning("%s: %s", f, e)
            changed = [f"{c.kind}/{c.name} {c.change}" for c in report.changes if c.change != "unchanged"]
            if changed:
                log.info("watch %s: %s", watch, ", ".join(changed))
        except Exception:  # noqa: BLE001 - a broken sync must not stop the daemon
            log.exception("sync of %s failed", watch)
    sync()
    observer = Observer()
    observer.schedule(_Debounced(sync), str(watch), recursive=True)
    observer.start()
    return observer


def serve(layout: Layout, watch: Path | None = None, interval: float = 2.0, bind: str | None = None,
          token_file: Path | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = None
    host = port = None
    if bind is not None:  # checked before anything starts: a refused bind leaves no half-started daemon
        host, port = parse_bind(bind)
        token = load_or_create_token(token_file) if token_file else None
        check_bind(host, token)
        if token is None:
            log.warning("TCP %s:%d without a token: every local user can drive this daemon", host, port)
    rt = Runtime(layout)
    _recover(rt)
    audit = AuditLog(layout.home)
    control = Control(rt, reconciler=Reconciler(rt, on_action=_audit_hook(audit)))
    stop = threading.Event()
    loop = threading.Thread(target=control.reconciler.run_forever, args=(stop, interval), name="forkd-loop",
                            daemon=True)
    observer = _watch(control, watch) if watch is not None else None
    sock = layout.daemon_socket
    sock.unlink(missing_ok=True)
    from forkd.api.app import create_app

    app = create_app(control, token=token, audit=audit)
    config = uvicorn.Config(app, uds=str(sock), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    tcp: uvicorn.Server | None = None
    if host is not None:
        tcp = uvicorn.Server(uvicorn.Config(TagTransport(app), host=host, port=port, log_level="warning",
                                            access_log=False))
        # a second thread runs the TCP listener (uvicorn installs signal handlers only on the main thread)
        threading.Thread(target=tcp.run, name="forkd-tcp", daemon=True).start()
        log.info("API on %s and http://%s:%d (%s)", sock, host, port, "bearer token" if token else "no token")

    def shutdown(*_: object) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, shutdown)
    write_bytes(layout.daemon_pid, f"{os.getpid()}\n".encode())
    loop.start()
    threading.Thread(target=_restrict_socket, args=(server, sock), daemon=True).start()
    try:
        server.run()
    finally:
        if tcp is not None:
            tcp.should_exit = True
        stop.set()
        control.reconciler.wake.set()
        if observer:
            observer.stop()
        sock.unlink(missing_ok=True)
        layout.daemon_pid.unlink(missing_ok=True)
