"""`forkd serve` as a real process on the fake VMM driver (tests/fake_vmm.py; watch, claims and adoption are logic
above it): GitOps watch (add, change, bad file, remove), claims through its socket, and a kill -9 of the daemon:
after a restart its children are adopted, nothing duplicated or leaked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import forkd_cli, qemu_pids
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.scrape import scraped

PARENT = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: dp}
spec: {memoryMiB: 256, warmup: {imports: [json]}}
"""
INTERVAL = 0.5  # seconds between the daemon's reconcile passes (and looks at the watched directory)
POOL = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: dpool}}
spec: {{from: dp, warm: {warm}}}
"""


def start_daemon(home: Path, watch: Path) -> subprocess.Popen:
    log = open(home / "daemon-test.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--watch", str(watch), "--interval",
                             str(INTERVAL)], env=dict(os.environ, FORKD_HOME=str(home)), stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not answers(home):  # not the socket file alone: a killed daemon's is still there
        assert proc.poll() is None, (home / "daemon-test.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "the daemon never answered on its socket"
        time.sleep(0.05)
    return proc


def _client(home: Path):
    import httpx

    return httpx.Client(transport=httpx.HTTPTransport(uds=str(home / "forkd.sock")), base_url="http://forkd",
                        timeout=30)


def answers(home: Path) -> bool:
    import httpx

    try:
        with _client(home) as c:
            return c.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def pool(name="dpool") -> dict | None:
    res = forkd_cli("get", "pools", name, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def wait_for(cond, timeout=180, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def reconciles(home: Path) -> float:
    """Reconcile passes the daemon of `home` has run (forkd_reconcile_seconds_count)."""
    with _client(home) as c:
        return scraped(c, "forkd_reconcile_seconds_count")


def idle(rt, name="dpool"):
    return sorted(r.id for r in rt.children() if r.pool == name and r.status == "running" and not r.claimed)


def ready_with(warm):
    p = pool()
    return p and (p.get("status") or {}).get("warm") == warm and p["spec"]["warm"] == warm and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])


def test_daemon_watch_claim_and_restart(rt, home, tmp_path):
    watch = tmp_path / "gitops"
    watch.mkdir()
    (watch / "parent.yaml").write_text(PARENT)
    (watch / "pool.yaml").write_text(POOL.format(warm=2))
    daemon = start_daemon(home, watch)
    try:
        wait_for(lambda: ready_with(2), what="pool ready with 2 warm")
        assert pool()["metadata"]["generation"] == 1
        assert stat_mode(home / "forkd.sock") == 0o600

        # change a file: updated in place (generation moves), pool scaled
        (watch / "pool.yaml").write_text(POOL.format(warm=3))
        wait_for(lambda: ready_with(3), what="pool scaled to 3 by the watch")
        assert pool()["metadata"]["generation"] == 2

        # a bad file changes nothing and says why
        (watch / "pool.yaml").write_text(POOL.format(warm=3) + "  replicas: 9\n")
        wait_for(lambda: "InvalidSpec" in forkd_cli("describe", "pool/dpool").stdout, what="InvalidSpec event")
        assert pool()["spec"]["warm"] == 3 and pool()["metadata"]["generation"] == 2

        # claim through the daemon: handed out at once, pool refills in the background
        (watch / "pool.yaml").write_text(POOL.format(warm=3))
        res = forkd_cli("claim", "dpool", "--count", "2", "-o", "json", check=True)
        claimed = [c["id"] for c in json.loads(res.stdout)["children"]]
        assert len(claimed) == 2
        wait_for(lambda: len(idle(rt)) == 3, what="pool refilled to 3")

        # kill -9 the daemon: children keep running; a new daemon adopts them and duplicates nothing
        before = set(idle(rt)) | set(claimed)
        qemu_before = set(qemu_pids(home))
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        for r in rt.children():
            if r.id in before:
                assert r.status == "running"
        daemon = start_daemon(home, watch)
        wait_for(lambda: ready_with(3), what="ready after restart")
        passes = reconciles(home)
        wait_for(lambda: reconciles(home) >= passes + 3, what="three reconcile passes after the restart")
        assert set(idle(rt)) | set(claimed) == before
        assert set(qemu_pids(home)) == qemu_before
        for cid in claimed:
            assert rt.ping(cid)["child_id"] == cid

        # remove the pool's file: pruned; its idle children are retired, claimed ones stay
        (watch / "pool.yaml").unlink()
        wait_for(lambda: pool() is None, what="pool pruned")
        try:  # a retired child is listed as `stopping` for a moment
            wait_for(lambda: {r.id for r in rt.children() if r.pool == "dpool"} == set(claimed), timeout=60)
        except AssertionError:
            left = {r.id: (r.status, r.claimed) for r in rt.children() if r.pool == "dpool"}
            raise AssertionError(f"the pool's children left once it was pruned: {left}, claimed {claimed}") from None
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        left = [r.id for r in rt.children() if r.pool == "dpool"]
        if left:
            rt.kill(left)
    assert not (home / "forkd.sock").exists()


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
