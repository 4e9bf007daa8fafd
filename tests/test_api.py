"""The daemon's REST API as a real process (`python -m forkd.api serve --bind ... --token-file ...`) on the fake
VMM driver (tests/fake_vmm.py): upstream-shaped requests and status codes, token auth on TCP, problem+json errors,
files, pools, metrics. The helpers that start a daemon are shared with test_sdk, test_mcp, test_audit (real VMs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from forkd.api.auth import check_bind, is_loopback, load_or_create_token, parse_bind
from forkd.base.errors import InvalidInput
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

PROBLEM = "application/problem+json"


# -- a daemon for a test module (the functions are shared with test_sdk, test_mcp, test_audit) -------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, proc: subprocess.Popen, home: Path, url: str, token: str, log: Path):
        self.proc, self.home, self.url, self.token, self.log = proc, home, url, token, log
        self.sock = str(home / "forkd.sock")

    def tcp(self, token: str | None = "good") -> httpx.Client:
        tok = self.token if token == "good" else token
        return httpx.Client(base_url=self.url, timeout=300,
                            headers={"Authorization": f"Bearer {tok}"} if tok else {})

    def unix(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=self.sock), base_url="http://forkd", timeout=300)

    def env(self) -> dict[str, str]:
        return dict(os.environ, FORKD_HOME=str(self.home), FORKD_URL=self.url, FORKD_TOKEN=self.token)


def start_api_daemon(home: Path, tmp: Path) -> Daemon:
    port = free_port()
    token_file = tmp / "token"
    log = tmp / "daemon.log"
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "1",
                             "--bind", f"127.0.0.1:{port}", "--token-file", str(token_file)],
                            env=dict(os.environ, FORKD_HOME=str(home)), stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "daemon did not come up:\n" + log.read_text()[-3000:]
        try:
            if (home / "forkd.sock").exists() and httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return Daemon(proc, home, url, token_file.read_text().strip(), log)


def stop_api_daemon(d: Daemon) -> None:
    d.proc.send_signal(signal.SIGTERM)
    try:
        d.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait()


@pytest.fixture(scope="module")
def daemon(home, fake_base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("api"))
    yield d
    stop_api_daemon(d)


# -- no VMs ---------------------------------------------------------------------------------------------
def test_bind_parsing_and_token_rules(tmp_path):
    assert parse_bind("127.0.0.1") == ("127.0.0.1", 8889)
    assert parse_bind("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_bind("[::1]:7") == ("::1", 7)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    for host in ("127.0.0.1", "::1", "0.0.0.0"):  # every TCP bind needs a token, loopback included
        with pytest.raises(InvalidInput, match="without a token") as exc:
            check_bind(host, None)
        assert "--token-file" in (exc.value.hint or "")
    check_bind("0.0.0.0", "t" * 44)
    tok = load_or_create_token(tmp_path / "t")
    assert (tmp_path / "t").stat().st_mode & 0o777 == 0o600
    import base64

    assert len(base64.b64decode(tok)) == 32
    assert load_or_create_token(tmp_path / "t") == tok
    (tmp_path / "t").chmod(0o644)
    with pytest.raises(InvalidInput, match="others can read"):
        load_or_create_token(tmp_path / "t")


def test_non_loopback_bind_without_token_is_refused(tmp_path):
    home = tmp_path / "h"  # its own home: a daemon that did start must not touch the session's socket
    res = subprocess.run([sys.executable, "-m", "forkd.api", "serve", "--bind", f"0.0.0.0:{free_port()}"],
                         env=dict(os.environ, FORKD_HOME=str(home)), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "without a token" in res.stderr
    assert not (home / "forkd.sock").exists()


# -- the real daemon ----------------------------------------------------------------------------------------


def test_token_auth_on_tcp(daemon):
    assert httpx.get(f"{daemon.url}/healthz").json() == {"ok": True}  # open
    for client in (daemon.tcp(None), daemon.tcp("wrong-token-wrong-token")):
        with client as c:
            r = c.get("/v1/snapshots")
            assert r.status_code == 401
            assert r.headers["content-type"].startswith(PROBLEM)
            assert r.headers["www-authenticate"] == "Bearer"
            assert c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG}).status_code == 401
    with daemon.tcp() as c:
        assert c.get("/version").json()["api"] == "v1"
        assert BASE_TAG in [s["tag"] for s in c.get("/v1/snapshots").json()]
    with daemon.unix() as c:  # the unix socket (0600) needs no token
        assert c.get("/v1/snapshots").status_code == 200
    assert Path(daemon.sock).stat().st_mode & 0o777 == 0o600


def test_openapi_published(daemon):
    with daemon.tcp() as c:
        spec = c.get("/openapi.json").json()
    paths = spec["paths"]
    for p in ("/v1/snapshots", "/v1/snapshots/{tag}", "/v1/snapshots/{tag}/info", "/v1/snapshots/{tag}/compact",
              "/v1/sandboxes", "/v1/sandboxes/{id}", "/v1/sandboxes/{id}/exec", "/v1/sandboxes/{id}/eval",
              "/v1/sandboxes/{id}/ping", "/v1/sandboxes/{id}/branch", "/v1/sandboxes/{id}/files", "/v1/pools",
              "/v1/pools/{name}", "/v1/pools/{name}/claim", "/v1/pools/{name}/status", "/healthz", "/metrics"):
        assert p in paths, p
    assert "201" in paths["/v1/sandboxes"]["post"]["responses"]


def test_upstream_sandbox_flow(daemon, rt):
    with daemon.tcp() as c:
        r = c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "n": 2})
        assert r.status_code == 201, r.text
        sbs = r.json()
        assert len(sbs) == 2 and all(s["snapshot_tag"] == BASE_TAG and s["status"] == "running" for s in sbs)
        ids = [s["id"] for s in sbs]
        try:
            sid = ids[0]
            assert c.get(f"/v1/sandboxes/{sid}").json()["id"] == sid
            assert set(ids) <= {s["id"] for s in c.get("/v1/sandboxes").json()}

            r = c.post(f"/v1/sandboxes/{sid}/exec", json={"args": ["sh", "-c", "echo out; echo err >&2; exit 3"],
                                                          "timeout_secs": 30})
            assert r.status_code == 200
            assert r.json()["stdout"] == "out\n" and r.json()["stderr"] == "err\n" and r.json()["exit_code"] == 3

            r = c.post(f"/v1/sandboxes/{sid}/eval", json={"code": "WARM_GLOBAL"})
            assert r.json()["result"] == repr("set at warm-up") and r.json()["exit_code"] == 0
            r = c.post(f"/v1/sandboxes/{sid}/eval", json={"code": "1/0"})
            assert r.json()["error"]["type"] == "ZeroDivisionError" and r.json()["exit_code"] == 1
            assert c.post(f"/v1/sandboxes/{sid}/ping").json()["pong"] is True

            # files through the agent
            r = c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/api.txt"}, content=b"\x00bin\xff")
            assert r.status_code == 200 and r.json()["bytes"] == 5
            assert c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/api.txt"}).content == b"\x00bin\xff"
            assert c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/parent.txt"}).text == "parent\n"
            r = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/nope/x"})
            assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM)

            # a snapshot with running children cannot be deleted: 409 naming them
            r = c.delete(f"/v1/snapshots/{BASE_TAG}")
            assert r.status_code == 409 and sid in r.json()["detail"]
            assert r.headers["content-type"].startswith(PROBLEM)

            info = c.get(f"/v1/snapshots/{BASE_TAG}/info").json()
            assert info["status"] == "ready" and info["depth"] == 0 and set(ids) <= set(info["children"])

            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
            assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
        finally:
            for i in ids:
                c.delete(f"/v1/sandboxes/{i}")
    assert not [r for r in rt.children() if r.id in ids]


def test_errors_are_problem_json(daemon, rt, fake_base):
    wip = rt.store.begin(fake_base.with_(tag="api-wip", status="writing", labels={}))
    try:
        with daemon.tcp() as c:
            cases = [
                (c.post("/v1/sandboxes", json={"snapshot_tag": "api-wip"}), 409),  # not ready
                (c.post("/v1/sandboxes", json={"snapshot_tag": "no-such"}), 404),
                (c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "n": 1001}), 422),
                (c.post("/v1/sandboxes", json={"n": 1}), 422),
                # the base was built without a NIC: per-child namespaces need a parent built with network isolated
                (c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "per_child_netns": True}), 400),
                (c.post("/v1/sandboxes/cnope/exec", json={"args": ["true"]}), 404),
                (c.post("/v1/sandboxes/cnope/exec", json={"args": []}), 422),
                (c.post("/v1/snapshots", json={"tag": "Bad Tag!"}), 400),
                (c.get("/v1/snapshots/no-such/info"), 404),
                (c.delete("/v1/snapshots/no-such"), 404),
                (c.get("/v1/no-such-route"), 404),
                (c.post("/v1/pools/no-such/claim", json={"n": 1}), 404),
            ]
            for r, code in cases:
                assert r.status_code == code, (r.request.url, r.text)
                assert r.headers["content-type"].startswith(PROBLEM), r.request.url
                body = r.json()
                assert body["status"] == code and body["detail"] and body["error"] == body["detail"]
            assert c.get("/v1/snapshots/api-wip").json()["status"] == "writing"
    finally:
        rt.store.fail(wip, "test")
        rt.rmi("api-wip", force=True)


def test_pools_routes(daemon):
    doc = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "api-pool"},
           "spec": {"from": "api-missing-parent", "warm": 0}}
    with daemon.tcp() as c:
        r = c.post("/v1/pools", json=doc)
        assert r.status_code == 201, r.text
        assert r.json()["change"] == "created"
        doc["spec"]["maxChildren"] = 8
        r = c.put("/v1/pools/api-pool", json=doc)
        assert r.status_code == 200 and r.json()["change"] == "configured"
        assert "api-pool" in [p["metadata"]["name"] for p in c.get("/v1/pools").json()]
        assert c.get("/v1/pools/api-pool").json()["spec"]["maxChildren"] == 8
        deadline = time.monotonic() + 30
        while not c.get("/v1/pools/api-pool/status").json().get("conditions"):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        r = c.post("/v1/pools/api-pool/claim", json={"n": 1})
        assert r.status_code == 409 and "no ready snapshot" in r.json()["detail"]
        r = c.put("/v1/pools/other-name", json=doc)
        assert r.status_code == 400
        assert c.post("/v1/pools", json={**doc, "spec": {"warm": 1}}).status_code in (400, 422)
        assert c.delete("/v1/pools/api-pool").status_code == 204
        assert c.get("/v1/pools/api-pool").status_code == 404


def test_metrics_after_activity(daemon):
    with daemon.tcp() as c:
        [sb] = c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG}).json()
        c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"args": ["true"]})
        c.get("/v1/sandboxes/cnope")
        text = c.get("/metrics").text
        c.delete(f"/v1/sandboxes/{sb['id']}")
    lines = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert lines['forkd_spawn_seconds_count{pool="",reason="direct"}'] >= 1
    assert lines["forkd_spawn_request_seconds_count"] >= 1
    assert lines['forkd_snapshots{status="ready"}'] >= 1
    assert lines["forkd_sandboxes_active"] >= 1 and lines["forkd_vmm_processes"] >= 1
    assert lines['forkd_snapshot_chain_depth_bucket{le="0.0"}'] >= 1
    assert lines["forkd_snapshot_stored_bytes"] > 0
    assert lines['forkd_errors_total{kind="NotFound",status="404"}'] >= 1
    assert any(k.startswith("forkd_build_info{") for k in lines)
    assert "# TYPE forkd_claim_seconds histogram" in text and "forkd_branch_pause_seconds" in text
