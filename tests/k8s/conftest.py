"""Fixtures of the Kubernetes tests: the API server stand-in (kmock's emulator, tests/k8s/apiserver.py), real node
daemons (`forkd serve`, each on a store of its own: "nodes" on this one machine) and the real operator process
(`python -m forkd.operator run`) between them, started and stopped as a process (a restart is a new process)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from tests.k8s.apiserver import ApiServer


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0, log: Path | None = None) -> Any:
    """Poll `probe` until it returns something truthy (the observed state, not a clock, is what is waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A real `forkd serve` daemon on a store of its own, reached over its unix socket, or (with `token`) over TCP
    on loopback with that bearer token, as the DaemonSet's daemons share one; `memory_mib` is what it offers
    (FORKD_NODE_MEMORY_MIB); with `logdir` its log is kept there (`<name>-daemon.log`) after the node is gone;
    `driver`: its FORKD_VMM_DRIVER (default: this process's)."""

    def __init__(self, name: str, images: Path | None = None, token: str | None = None,
                 memory_mib: int | None = None, logdir: Path | None = None, driver: str | None = None) -> None:
        self.name, self.token, self.port = name, token, None
        self.home = Path(tempfile.mkdtemp(prefix=f"fk8s{name}", dir="/tmp"))
        self.layout = Layout(self.home).ensure()
        if images is not None:  # the guest image, and the packages it was built from (its id is their hash:
            shutil.rmtree(self.layout.images)  # without them a daemon downloads them again to name its image)
            shutil.copytree(images, self.layout.images, symlinks=True)
            debs = Layout(images.parent).debs
            if debs.is_dir():
                shutil.copytree(debs, self.layout.debs, dirs_exist_ok=True)
        self.log = (logdir / f"{name}-daemon.log") if logdir is not None else self.home / "daemon.log"
        argv = [sys.executable, "-m", "forkd.api", "serve", "--interval", "1"]
        if token is not None:
            self.port = free_port()
            tf = self.home / "api.token"
            tf.write_text(token + "\n")
            tf.chmod(0o600)
            argv += ["--bind", f"127.0.0.1:{self.port}", "--token-file", str(tf)]
        # an owned pull waits FORKD_PULL_GRACE for its object: long enough for the operator's apply right after it,
        # short enough that a deleted object's copies go within a test (the default would add a minute to each)
        env = dict(os.environ, FORKD_HOME=str(self.home), FORKD_PULL_GRACE="5")
        if memory_mib is not None:
            env["FORKD_NODE_MEMORY_MIB"] = str(memory_mib)
        if driver is not None:
            env["FORKD_VMM_DRIVER"] = driver
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        wait_for(f"node {name}'s socket", lambda: self.proc.poll() is not None or (
            self.layout.daemon_socket.exists() and (self.port is None or _listening(self.port))),
            timeout=120, log=self.log)  # a loaded machine starts a daemon slowly
        assert self.proc.poll() is None, self.log.read_text()[-2000:]

    @property
    def socket(self) -> str:
        return str(self.layout.daemon_socket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pod(self, namespace: str = "forkd-system") -> dict:
        """The DaemonSet's pod of this node as the API server would hold it once the kubelet reports it Ready."""
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"forkd-node-{self.name}", "namespace": namespace,
                             "labels": {"app.kubernetes.io/name": "forkd",
                                        "app.kubernetes.io/component": "node-daemon"}},
                "spec": {"nodeName": self.name, "containers": [
                    {"name": "forkd", "ports": [{"name": "api", "containerPort": self.port}]}]},
                "status": {"phase": "Running", "podIP": "127.0.0.1",
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        Runtime(self.layout).kill(all_=True)  # the daemon leaves its children running on SIGTERM (for adoption)
        shutil.rmtree(self.layout.flat_cache.parent, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Operator:
    """The operator as a process of its own (`python -m forkd.operator run`) against the stand-in's kubeconfig."""

    def __init__(self, api: ApiServer, nodes: list[Node] | None, workdir: Path, cwd: Path | None = None,
                 **env: str) -> None:
        """`nodes`: listed in FORKD_NODES; None: found from their pods (give FORKD_NODE_PODS in `env`); `cwd`:
        run from there (`python -m` imports the forkd of that checkout first: a benchmark's baseline)."""
        self.cwd = cwd
        self.env = dict(os.environ, KUBECONFIG=str(api.kubeconfig(workdir / "kubeconfig")),
                        FORKD_OPERATOR_INTERVAL="1", FORKD_OPERATOR_RETRY="1", FORKD_OPERATOR_DELETE_WAIT="30",
                        FORKD_OPERATOR_RELEASE_RETRY="0.2")
        self.env.update(env)
        for var in ("FORKD_DAEMON_SOCKET", "FORKD_NODES", "FORKD_NODE_PODS", "FORKD_URL"):
            if var not in env:
                self.env.pop(var, None)
        if nodes is not None:
            self.env["FORKD_NODES"] = ",".join(f"{n.name}={n.socket}" for n in nodes)
        self.log = workdir / "operator.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Operator:
        self.proc = subprocess.Popen([sys.executable, "-m", "forkd.operator", "run", "--verbose"], env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT, cwd=self.cwd)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the operator dies mid-work, as in a node failure or an OOM kill."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    server = ApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
