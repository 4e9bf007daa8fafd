"""`forkd serve`: the daemon that owns children and runs the reconcile loop, the API on a unix socket (0600), and
optionally a TCP listener (`--bind HOST:PORT`, bearer token from `--token-file`, required; `--tls-cert/--tls-key`;
`--allow-host`) and the GitOps directory watch. Both listeners are bound by forkd before uvicorn serves them: the
unix socket is born 0600 in a private directory (`bind_unix`), the TCP port's errors come before anything starts.
Mutating API calls and reconciler actions are appended to the hash-chained audit log ($FORKD_HOME/audit.log).

One daemon per $FORKD_HOME: it holds an exclusive lock on $FORKD_HOME/daemon.lock (holding its pid) for its
lifetime, taken before the socket or anything else is touched; a second `forkd serve` exits 4 (Conflict) naming the
first's pid and leaves its socket alone.

Start-up recovers what a crash left: `writing` snapshots whose writer died are marked failed, temporaries whose
maker died are removed (only those: each names its maker, forkd.base.owners, so a concurrent CLI's unpack, build
or branch goes on); running children are simply found in the registry and adopted by the loop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from forkd.api.auth import TagTransport, allowed_hosts, check_bind, load_or_create_token, parse_bind, peer_checked
from forkd.base import heap
from forkd.base.atomic import write_bytes
from forkd.base.errors import Conflict, InvalidInput, Unavailable
from forkd.base.locks import Flock, holder_note, try_lock
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import make_private_dir
from forkd.core.audit import AuditError, AuditLog
from forkd.reconciler.control import Control
from forkd.reconciler.gitops import sync_directory
from forkd.service import Service

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


LOCK_NAME = "daemon.lock"  # in $FORKD_HOME: held by the one daemon serving it, holds its pid


def _lock_home(layout: Layout) -> Flock:
    """The daemon's lock on its home, held until the process ends; Conflict (exit 4) naming the holder's pid."""
    path = layout.home / LOCK_NAME
    lock = try_lock(path)
    if lock is None:
        pid = holder_note(path) or "unknown"
        raise Conflict(f"another forkd daemon (pid {pid}) is serving {layout.home}: its lock {path} is held",
                       hint=f"use that daemon (FORKD_HOME={layout.home} forkd ... talks to it), stop it "
                            f"(kill {pid}) first, or serve another FORKD_HOME")
    lock.note(f"{os.getpid()}\n")
    return lock


def bind_unix(path: Path, private_dir: Path) -> socket.socket:
    """A listening unix socket at `path` that no other user could ever connect to: bound (umask 0177) inside a
    fresh 0700 directory under `private_dir`, chmod 0600, listening, and only then renamed into place (rename
    replaces a stale socket atomically). Call it before the daemon starts threads: the umask is per process."""
    tmpdir = make_private_dir(private_dir / owned_name(".sock"))
    tmp = tmpdir / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(str(tmp))
        finally:
            os.umask(old)
        os.chmod(tmp, 0o600)
        sock.listen(2048)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return sock


def _audit_hook(audit: AuditLog):
    """Record each reconciler action. Fail-open, by decision (README, SECURITY.md): an append that fails (disk
    full) does not stop reconciling; it is logged at ERROR and the next append that works first writes a
    `lost-entries` line naming it (forkd.core.audit), so the log says what it misses."""
    def on_action(action, ok: bool, message: str, ms: float) -> None:
        try:
            audit.append("reconciler", type(action).__name__, action.key, "ok" if ok else "error", ms,
                         message=message)
        except AuditError as exc:
            log.error("%s: not recorded in the audit log: %s", action.key, exc)
    return on_action


def _open_audit(home: Path) -> AuditLog:
    """The audit log, a torn tail a crash left cut off and recorded now (forkd.core.audit)."""
    audit = AuditLog(home)
    try:
        audit.recover()
    except OSError as exc:
        log.error("audit log %s: cannot check its tail: %s", audit.path, exc)
    return audit


@dataclass(frozen=True)
class Tcp:
    """The TCP listener, checked and bound before anything starts: a refused bind leaves no half-started daemon."""

    sock: socket.socket
    host: str
    port: int
    token: str | None
    hosts: frozenset[str]
    tls: tuple[str, str] | None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


def _tls(cert: Path | None, key: Path | None) -> tuple[str, str] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidInput("TLS needs both --tls-cert and --tls-key", hint="pass both PEM files, or neither")
    for p in (cert, key):
        if not Path(p).is_file():
            raise InvalidInput(f"TLS file {p} does not exist", hint="pass the PEM certificate and its key")
    if Path(key).stat().st_mode & 0o077:
        raise InvalidInput(f"TLS key {key} is readable by others",
                           hint=f"chmod 600 {key} (a Kubernetes secret volume: defaultMode: 0400)")
    try:  # fail here, not later on the listener's thread
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise InvalidInput(f"TLS certificate {cert} / key {key} do not load: {exc}",
                           hint="pass a PEM certificate (chain) and its unencrypted PEM key") from None
    return str(cert), str(key)


def _tcp(bind: str | None, token_file: Path | None, tls_cert: Path | None = None, tls_key: Path | None = None,
         allow_hosts: tuple[str, ...] = ()) -> Tcp | None:
    """The bound TCP listener (--bind), None without --bind."""
    if bind is None:
        if tls_cert or tls_key or allow_hosts:
            raise InvalidInput("--tls-cert, --tls-key and --allow-host apply to the TCP listener",
                               hint="add --bind HOST:PORT")
        return None
    host, port = parse_bind(bind)
    token = load_or_create_token(token_file) if token_file is not None else None
    check_bind(host, token)
    tls = _tls(tls_cert, tls_key)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        raise Unavailable(f"cannot listen on TCP {host}:{port}: {exc.strerror or exc}",
                          hint="pick a free port or address for --bind") from None
    return Tcp(sock, host, sock.getsockname()[1], token, allowed_hosts(host, allow_hosts), tls)


def _watch(control: Control, watch: Path) -> Observer:
    """Apply `watch` now and on every change (debounced); the returned observer is running."""
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


def _servers(app, usock: socket.socket, tcp: Tcp | None, denials) -> tuple[uvicorn.Server, uvicorn.Server | None]:
    """The unix-socket server (run on the main thread) and the TCP one, started on its own thread (uvicorn
    installs signal handlers only on the main thread). log_config=None: uvicorn logs through forkd's set-up;
    ws="wsproto": WebSocket upgrades reach the Gate, which refuses every one but a sandbox port's
    (forkd.api.routes_ports)."""
    common = {"log_level": "warning", "access_log": False, "log_config": None, "ws": "wsproto"}
    unix_http = peer_checked(import_from_string(HTTP_PROTOCOLS["auto"]), on_refused=denials.record)
    server = uvicorn.Server(uvicorn.Config(app, http=unix_http, **common))
    if tcp is None:
        return server, None
    ssl = {"ssl_certfile": tcp.tls[0], "ssl_keyfile": tcp.tls[1]} if tcp.tls else {}
    tcp_server = uvicorn.Server(uvicorn.Config(TagTransport(app), **common, **ssl))
    threading.Thread(target=tcp_server.run, kwargs={"sockets": [tcp.sock]}, name="forkd-tcp", daemon=True).start()
    log.info("API on %s and %s (bearer token)", usock.getsockname(), tcp.url)
    return server, tcp_server


def serve(layout: Layout, watch: Path | None = None, interval: float = 2.0, bind: str | None = None,
          token_file: Path | None = None, tls_cert: Path | None = None, tls_key: Path | None = None,
          allow_hosts: tuple[str, ...] = ()) -> None:
    """Run the daemon until SIGTERM/SIGINT (logging is set up by the caller: forkd.base.logs.setup)."""
    service = Service.on(layout)
    home_lock = _lock_home(layout)  # before the socket, the port or any recovery: Conflict if a daemon runs
    try:
        _serve(service, watch, interval, _tcp(bind, token_file, tls_cert, tls_key, tuple(allow_hosts)))
    finally:
        home_lock.release()


def _serve(service: Service, watch: Path | None, interval: float, tcp: Tcp | None) -> None:
    rt, layout = service.rt, service.rt.layout
    heap.limit_arenas()  # before the daemon's threads: its RSS then follows what it holds (forkd.base.heap)
    service.recover()
    sock = layout.daemon_socket
    usock = bind_unix(sock, layout.tmp)  # before any thread starts (umask)
    audit = _open_audit(layout.home)
    control = service.reconcile_with(on_action=_audit_hook(audit))
    stop = threading.Event()
    loop = threading.Thread(target=control.reconciler.run_forever, args=(stop, interval), name="forkd-loop",
                            daemon=True)
    observer = _watch(control, watch) if watch is not None else None
    from forkd.api.app import create_app

    app = create_app(service, token=tcp.token if tcp else None, audit=audit, hosts=tcp.hosts if tcp else None)
    server, tcp_server = _servers(app, usock, tcp, app.state.denials)

    def shutdown(*_: object) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, shutdown)
    write_bytes(layout.daemon_pid, f"{os.getpid()}\n".encode())
    loop.start()
    rt.start_sweeper(stop, audit)  # sandbox lifetimes, throw-away branch snapshots
    try:
        server.run(sockets=[usock])
    finally:
        if tcp_server is not None:
            tcp_server.should_exit = True
        stop.set()
        control.reconciler.wake.set()
        if observer:
            observer.stop()
        sock.unlink(missing_ok=True)
        layout.daemon_pid.unlink(missing_ok=True)
        app.state.denials.flush()
