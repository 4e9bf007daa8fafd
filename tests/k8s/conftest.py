"""Fixtures of the Kubernetes tests: the API server stand-in (kmock's emulator, tests/k8s/apiserver.py), real node
daemons (`forkd serve`, each on a store of its own: "nodes" on this one machine) and the real operator process
(`python -m forkd.operator run`) between them, started and stopped as a process (a restart is a new process)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forkd.base.paths import Layout
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


class Node:
    """A real `forkd serve` daemon on a store of its own, reached over its unix socket."""

    def __init__(self, name: str, images: Path | None = None) -> None:
        self.name = name
        self.home = Path(tempfile.mkdtemp(prefix=f"fk8s{name}", dir="/tmp"))
        self.layout = Layout(self.home).ensure()
        if images is not None:
            shutil.rmtree(self.layout.images)
            shutil.copytree(images, self.layout.images, symlinks=True)
        self.log = self.home / "daemon.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "1"],
                                     env=dict(os.environ, FORKD_HOME=str(self.home)),
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        wait_for(f"node {name}'s socket", lambda: self.proc.poll() is not None or self.layout.daemon_socket.exists(),
                 timeout=30, log=self.log)
        assert self.proc.poll() is None, self.log.read_text()[-2000:]

    @property
    def socket(self) -> str:
        return str(self.layout.daemon_socket)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


class Operator:
    """The operator as a process of its own (`python -m forkd.operator run`) against the stand-in's kubeconfig."""

    def __init__(self, api: ApiServer, nodes: list[Node], workdir: Path, **env: str) -> None:
        self.env = dict(os.environ, KUBECONFIG=str(api.kubeconfig(workdir / "kubeconfig")),
                        FORKD_NODES=",".join(f"{n.name}={n.socket}" for n in nodes),
                        FORKD_OPERATOR_INTERVAL="1", FORKD_OPERATOR_RETRY="1", FORKD_OPERATOR_DELETE_WAIT="30",
                        **env)
        self.env.pop("FORKD_DAEMON_SOCKET", None)
        self.log = workdir / "operator.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Operator:
        self.proc = subprocess.Popen([sys.executable, "-m", "forkd.operator", "run", "--verbose"], env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
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
