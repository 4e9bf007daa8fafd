"""A private forkd home with its own daemon, driven through the real CLI: what the crash harness (tests/chaos) and
bench/soak.py stand on.

Every process started here is tracked by pid; nothing is ever found or killed by name. Leftovers of this home are
found by the home's path (QEMU command lines, cgroup subtree, network leases), never by guessing."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {{name: cx-p}}
spec: {{memoryMiB: 256, warmup: {{imports: [json]}}}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: cx-a}}
spec: {{from: cx-p, warm: {warm}, maxChildren: {max_children}}}
"""
ISOLATED = """\
---
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: cx-n}
spec: {memoryMiB: 256, network: isolated, warmup: {imports: [json]}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: cx-i}
spec: {from: cx-n, warm: 1, maxChildren: 3, child: {network: isolated, memoryLimitMiB: 768}}
"""


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def seed_home(home: Path, image_from: Path | None) -> None:
    """Give a fresh home the guest image (and the accelerator probe's result) of an existing one, so nothing is
    downloaded or rebuilt; without `image_from` the daemon builds the image itself on first apply."""
    if image_from is None or not (image_from / "images" / "default").is_file():
        return
    shutil.copytree(image_from / "images", home / "images", dirs_exist_ok=True)
    (home / "cache").mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(image_from / "cache" / "accel.json", home / "cache" / "accel.json")


def die_with_parent() -> None:
    """In the daemon before exec: SIGKILL it when the harness thread that started it dies.

    A harness killed with -9 (or its parent gone) must not leave its daemon serving a deleted home. The kernel
    ties the signal to the starting thread, so a seed's daemons are all started from that seed's one thread.
    """
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Rig:
    """One private $FORKD_HOME, its daemon and every CLI process run against it."""

    home: Path
    interval: float = 0.5
    daemon: subprocess.Popen | None = None
    procs: dict[int, tuple[str, subprocess.Popen]] = field(default_factory=dict)  # in-flight CLI processes
    lock: threading.Lock = field(default_factory=threading.Lock)
    log_path: Path | None = None
    starts: int = 0  # daemons started so far (a failure is the daemon's only if no restart came in between)

    @classmethod
    def create(cls, home: Path | None = None, image_from: Path | None = None, interval: float = 0.5) -> Rig:
        home = Path(home or tempfile.mkdtemp(prefix="fkc", dir="/tmp")).absolute()
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        seed_home(home, image_from)
        return cls(home=home, interval=interval, log_path=home.parent / f"{home.name}-daemon.log")

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("FORKD_URL", "FORKD_TOKEN", "FORKD_NO_DAEMON",
                                                                "FORKD_DAEMON_SOCKET")}
        env.update(FORKD_HOME=str(self.home), PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
                   FORKD_SANDBOX_TIMEOUT="0")  # the promise checked: a claimed child lives until someone kills it
        return env

    # -- the daemon ------------------------------------------------------------------------------------------

    def start_daemon(self, timeout: float = 60.0) -> float:
        """Start `forkd serve`; returns the seconds until its socket answered."""
        t0 = time.monotonic()
        self.starts += 1
        out = open(self.log_path, "ab")  # noqa: SIM115 - the daemon's stdout/stderr for its whole life
        self.daemon = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "serve", "--interval",
                                        str(self.interval)], env=self.env, stdout=out, stderr=out,
                                       start_new_session=True, preexec_fn=die_with_parent)
        out.close()
        while not self.answers():
            if self.daemon.poll() is not None:
                raise RuntimeError(f"forkd serve exited {self.daemon.returncode}: {self.daemon_log_tail()}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"forkd serve did not answer in {timeout:.0f} s: {self.daemon_log_tail()}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, object]:
        """GET `path` from the daemon's unix socket: (status, JSON body). OSError when nothing answers."""
        sock = str(self.home / "forkd.sock")

        class Conn(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(sock)

        c = Conn("localhost", timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
        finally:
            c.close()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, None

    def answers(self) -> bool:
        if not (self.home / "forkd.sock").exists():
            return False
        try:
            return self.http_get("/healthz", 2.0)[0] < 500
        except (OSError, http.client.HTTPException):
            return False

    def pools(self) -> list[dict]:
        """The pools as the daemon reports them (objects with spec and status)."""
        status, body = self.http_get("/v1/objects/ForkPool")
        if status != 200 or not isinstance(body, dict):
            raise OSError(f"GET /v1/objects/ForkPool answered {status}")
        return body["items"]

    def kill_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGKILL)
            self.daemon.wait()

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.kill_daemon()

    def daemon_pid(self) -> int | None:
        return self.daemon.pid if self.daemon is not None and self.daemon.poll() is None else None

    def daemon_log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # -- the CLI ---------------------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 300.0, what: str | None = None) -> subprocess.CompletedProcess:
        """Run `forkd ARGS` (tracked while it runs, so the harness can kill -9 it)."""
        p = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", *args], env=self.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        with self.lock:
            self.procs[p.pid] = (what or args[0], p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        finally:
            with self.lock:
                self.procs.pop(p.pid, None)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def in_flight(self) -> list[tuple[int, str, subprocess.Popen]]:
        with self.lock:
            return [(pid, what, p) for pid, (what, p) in self.procs.items()]

    def json(self, *args: str) -> object:
        res = self.cli(*args, "-o", "json")
        if res.returncode != 0:
            raise RuntimeError(f"forkd {' '.join(args)} exited {res.returncode}: {res.stderr[-2000:]}")
        return json.loads(res.stdout)

    def apply(self, text: str, name: str = "chaos.yaml") -> subprocess.CompletedProcess:
        path = self.home.parent / f"{self.home.name}-{name}"
        path.write_text(text)
        return self.cli("apply", "-f", str(path))

    # -- clean-up --------------------------------------------------------------------------------------------

    def destroy(self) -> list[int]:
        """Stop everything this home runs and remove it. Returns QEMU pids that had to be killed by hand (leaks)."""
        for _pid, _, p in self.in_flight():
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        self.stop_daemon()
        env = dict(self.env, FORKD_NO_DAEMON="1")
        subprocess.run([sys.executable, "-m", "forkd.cli.main", "kill", "--all"], env=env, capture_output=True,
                       timeout=300)
        subprocess.run([sys.executable, "-m", "forkd.cli.main", "gc", "--grace", "0"], env=env,
                       capture_output=True, timeout=300)
        from tests.chaos.invariants import home_qemu_pids

        leaked = home_qemu_pids(self.home)
        for pid in leaked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        from forkd.base.paths import Layout

        shm = _shm_dir(Layout(self.home))
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)
        # beside the home: its spec and pack files, and the temporaries of a `forkd pack` killed mid-write
        # (`.<home>-<tag>.tar.zst.tmp-<owner>`: beside an output file, where no gc of the home looks)
        for p in [*self.home.parent.glob(f"{self.home.name}-*"), *self.home.parent.glob(f".{self.home.name}-*")]:
            if p.is_file() and p != self.log_path:
                p.unlink(missing_ok=True)
        return leaked


def _shm_dir(layout) -> Path | None:
    with contextlib.suppress(Exception):
        return layout.shm_dir
    return None
