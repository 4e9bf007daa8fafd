"""`forkd serve`: the daemon that owns children and runs the reconcile loop, the API on a unix socket, and
optionally the GitOps directory watch.

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

from forkd.base.atomic import write_bytes
from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
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
    failed = rt.store.recover()
    if failed:
        log.warning("marked snapshots left writing by a crash as failed: %s", ", ".join(failed))
    for p in rt.layout.tmp.iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    adopted = [c.id for c in rt.children() if c.status == "running"]
    log.info("adopted %d running children", len(adopted))


def _restrict_socket(server: uvicorn.Server, sock: Path) -> None:
    """uvicorn makes its unix socket 0666; only the daemon's owner may drive it."""
    while not server.started and not server.should_exit:
        time.sleep(0.01)
    if sock.exists():
        os.chmod(sock, 0o600)


def serve(layout: Layout, watch: Path | None = None, interval: float = 2.0) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rt = Runtime(layout)
    _recover(rt)
    control = Control(rt)
    stop = threading.Event()
    loop = threading.Thread(target=control.reconciler.run_forever, args=(stop, interval), name="forkd-loop",
                            daemon=True)
    observer = None
    if watch is not None:
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
    sock = layout.daemon_socket
    sock.unlink(missing_ok=True)
    from forkd.api.app import create_app

    config = uvicorn.Config(create_app(control), uds=str(sock), log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    def shutdown(*_: object) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, shutdown)
    write_bytes(layout.daemon_pid, f"{os.getpid()}\n".encode())
    loop.start()
    threading.Thread(target=_restrict_socket, args=(server, sock), daemon=True).start()
    try:
        server.run()
    finally:
        stop.set()
        control.reconciler.wake.set()
        if observer:
            observer.stop()
        sock.unlink(missing_ok=True)
        layout.daemon_pid.unlink(missing_ok=True)
