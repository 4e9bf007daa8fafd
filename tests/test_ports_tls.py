"""A sandbox's ports through a daemon that serves TLS (`forkd serve --bind --tls-cert --tls-key`, a self-signed
certificate the clients trust through FORKD_CA), on the fake VMM driver (tests/fake_vmm.py): the point here is the
daemon's TLS listener, its grants and its tunnels, not the guest (tests/test_ports.py and tests/test_ports_relay.py
drive real servers in real children). The servers stand in the fake child's network namespace, on its loopback,
where its agent relays to (as in tests/test_mcp_ports.py).

The SDK's get_url over https, a WebSocket over wss, `forkd port-forward` over https (refused without FORKD_CA), and
the grants' secrets: a token is shown once, the listing, the grants file, the audit log and the daemon's log never
hold it; a grant is revoked by its id while the port's others stay; grants outlive a daemon restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from forkd.core.ports import GRANTS
from forkd.sdk import Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.security.test_daemon_api import _self_signed
from tests.test_api import Daemon, stop_api_daemon
from tests.test_mcp_ports import _serve_in
from tests.test_ports import WS_ECHO, _ws
from tests.test_ports_relay import _echo

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tls():
    d = Path(tempfile.mkdtemp(prefix="forkd-ports-tls-", dir="/tmp"))
    yield _self_signed(d)
    subprocess.run(["rm", "-rf", str(d)], check=False)


def _start(home: Path, tmp: Path, cert: Path, key: Path) -> Daemon:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp / "daemon.log"
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "1", "--bind",
                             f"127.0.0.1:{port}", "--token-file", str(tmp / "token"), "--tls-cert", str(cert),
                             "--tls-key", str(key)],
                            env=dict(os.environ, FORKD_HOME=str(home)), stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "daemon did not come up:\n" + log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=2, verify=ssl.create_default_context(cafile=cert)).is_success:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return Daemon(proc, home, url, (tmp / "token").read_text().strip(), log)


@pytest.fixture(scope="module")
def daemon(home, fake_base, tls, tmp_path_factory):
    cert, key = tls
    tmp = tmp_path_factory.mktemp("ports-tls")
    old = os.environ.get("FORKD_CA")
    os.environ["FORKD_CA"] = str(cert)  # the SDK in this process trusts the daemon's certificate
    d = _start(home, tmp, cert, key)
    d.tmp = tmp
    yield d
    stop_api_daemon(d)
    if old is None:
        os.environ.pop("FORKD_CA", None)
    else:
        os.environ["FORKD_CA"] = old


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)


def _in_namespace(netns_name: str, make):
    from forkd.sandbox import netns

    with netns.inside(netns_name):
        return make()


def _servers(rt, child: str) -> dict[str, int]:
    """In the fake child's namespace: an HTTP server (what `_serve_in` starts), a TCP echo, a WebSocket echo on
    8002 (tests/test_ports.py's WS_ECHO, run in a thread that stays in the namespace)."""
    ns = rt.child(child).netns
    http_srv = _serve_in(ns)
    echo = _in_namespace(ns, lambda: socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo))
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    ready = threading.Event()

    def ws() -> None:
        from forkd.sandbox import netns

        with netns.inside(ns):
            ready.set()
            exec(WS_ECHO, {"__name__": "ws_echo"})  # noqa: S102 - the test's own WebSocket echo server

    threading.Thread(target=ws, daemon=True).start()
    ready.wait(30)
    _wait_listening(ns, 8002)
    return {"http": http_srv.server_port, "tcp": echo.server_address[1], "ws": 8002}


def _wait_listening(ns: str, port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _in_namespace(ns, lambda: socket.create_connection(("127.0.0.1", port), 1)).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port} in {ns}"
            time.sleep(0.05)


def _port_forward(daemon, child: str, port: int, ca: Path | None) -> subprocess.Popen:
    env = {**os.environ, "FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token}
    env.pop("FORKD_CA", None)
    if ca is not None:
        env["FORKD_CA"] = str(ca)
    return subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "port-forward", child, str(port), "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _listening(proc: subprocess.Popen) -> tuple[str, int]:
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no line"
    host, port = json.loads(line)["listen"].rsplit(":", 1)
    return host, int(port)


def test_http_websocket_and_port_forward_through_tls(daemon, rt, tls):
    cert, _ = tls
    ctrl = Controller(url=daemon.url, token=daemon.token)
    sb = Sandbox.create(template=BASE_TAG, controller=ctrl)
    try:
        ports = _servers(rt, sb.id)
        url = sb.get_url(ports["http"])
        assert url.startswith(f"{daemon.url}/v1/ports/{sb.id}/{ports['http']}/") and sb.get_url(ports["http"]) == url
        web = httpx.Client(verify=ssl.create_default_context(cafile=cert), timeout=60)  # no bearer
        assert web.get(url + "x?y=1").text == "hello /x?y=1"
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the certificate gets nothing
            httpx.get(url + "x", timeout=30)
        ws = sb.get_url(ports["ws"]).replace("https://", "wss://")
        assert _ws(ws + "chat", ["hi", "there"], cert) == (101, ["echo /chat hi", "echo /chat there"])
        token = ws.rstrip("/").rsplit("/", 1)[1]
        assert _ws(ws.replace(token, secrets.token_urlsafe(32)) + "chat", ["hi"], cert)[0] == 403

        refused = _port_forward(daemon, sb.id, ports["tcp"], ca=None)  # the daemon's certificate is not trusted
        _, err = refused.communicate(timeout=120)
        assert refused.returncode != 0 and "FORKD_CA" in err, err
        proc = _port_forward(daemon, sb.id, ports["tcp"], ca=cert)
        try:
            addr = _listening(proc)
            payload = secrets.token_bytes(1 << 20)
            assert _echo(addr, payload) == payload
            listed = ctrl.list_ports(sb.id)
            assert [g.port for g in listed].count(ports["tcp"]) == 1  # port-forward's own grant
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        assert ports["tcp"] not in [g.port for g in ctrl.list_ports(sb.id)]  # revoked as it stopped
    finally:
        sb.kill()


def test_a_token_is_shown_once_and_kept_nowhere(daemon, rt, tls):
    """Two grants of one port: each URL works; the listing (REST, SDK), the grants file, the audit log and the
    daemon's log hold neither token; revoking one by its id leaves the other; a port's grants go at --close."""
    cert, _ = tls
    ctrl = Controller(url=daemon.url, token=daemon.token)
    sb = Sandbox.create(template=BASE_TAG, controller=ctrl)
    try:
        port = _servers(rt, sb.id)["http"]
        one, two = ctrl.open_port(sb.id, port), ctrl.open_port(sb.id, port)
        assert one.token != two.token and one.id != two.id and one.path.endswith(f"/{one.token}/")
        web = httpx.Client(base_url=daemon.url, verify=ssl.create_default_context(cafile=cert), timeout=60)
        assert web.get(one.path + "a").text == "hello /a" and web.get(two.path + "b").text == "hello /b"
        api = httpx.Client(base_url=daemon.url, verify=ssl.create_default_context(cafile=cert), timeout=60,
                           headers={"Authorization": f"Bearer {daemon.token}"})
        raw = api.get(f"/v1/sandboxes/{sb.id}/ports")
        assert raw.status_code == 200
        assert {g["id"] for g in raw.json()} == {one.id, two.id}
        assert all(g["path"] == f"/v1/ports/{sb.id}/{port}/{{token}}/" and "token" not in g for g in raw.json())
        kept = [
            raw.text,
            (Path(rt.child(sb.id).dir) / GRANTS).read_text(),
            (daemon.home / "audit.log").read_text(),
            daemon.log.read_text(),
        ]
        for where, text in zip(("listing", "grants file", "audit log", "daemon log"), kept, strict=True):
            for tok in (one.token, two.token):
                assert tok not in text and tok[:12] not in text, where

        assert api.delete(f"/v1/sandboxes/{sb.id}/ports/{one.id}").status_code == 204  # revoked by its id
        assert web.get(one.path + "a").status_code == 404 and web.get(two.path + "b").text == "hello /b"
        assert api.delete(f"/v1/sandboxes/{sb.id}/ports/{one.id}").status_code == 404
        assert api.delete(f"/v1/sandboxes/{sb.id}/ports/gnope").status_code == 400  # neither a port nor an id
        assert api.delete(f"/v1/sandboxes/{sb.id}/ports/{port}").status_code == 204  # every grant of the port
        assert web.get(two.path + "b").status_code == 404 and ctrl.list_ports(sb.id) == []

        url, same, host = asyncio.run(_async_urls(daemon, sb.id, port))  # the async SDK: once per port too
        assert same == url and host == url.split("://", 1)[1] and web.get(url + "c").status_code == 404
    finally:
        sb.kill()


async def _async_urls(daemon, sid: str, port: int) -> tuple[str, str, str]:
    """AsyncSandbox's get_url twice and get_host (one grant: its page answers), then close_port."""
    from forkd.sdk import AsyncController, AsyncSandbox

    sb = await AsyncSandbox.connect(sid, controller=AsyncController(url=daemon.url, token=daemon.token))
    url = await sb.get_url(port)
    same, host = await sb.get_url(port), await sb.get_host(port)
    assert [g.port for g in await sb.controller.list_ports(sid)] == [port]
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=os.environ["FORKD_CA"])) as web:
        assert (await web.get(url + "c", timeout=60)).text == "hello /c"
    await sb.close_port(port)
    return url, same, host


def test_grants_outlive_a_daemon_restart(daemon, rt, tls):
    cert, key = tls
    ctrl = Controller(url=daemon.url, token=daemon.token)
    sb = Sandbox.create(template=BASE_TAG, controller=ctrl)
    try:
        port = _servers(rt, sb.id)["http"]
        kept, gone = ctrl.open_port(sb.id, port), ctrl.open_port(sb.id, port)
        ctrl.close_port(sb.id, gone.id)
        stop_api_daemon(daemon)
        again = _start(daemon.home, daemon.tmp, cert, key)  # the same home and token file, another TCP port
        daemon.proc, daemon.url = again.proc, again.url
        web = httpx.Client(base_url=again.url, verify=ssl.create_default_context(cafile=cert), timeout=60)
        assert web.get(kept.path + "k").text == "hello /k"
        assert web.get(gone.path + "g").status_code == 404
        ctrl = Controller(url=again.url, token=again.token)
        assert [g.id for g in ctrl.list_ports(sb.id)] == [kept.id]
    finally:
        Controller(url=daemon.url, token=daemon.token).kill_sandbox(sb.id)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_typescript_sdks_port_helpers_through_tls(daemon, rt, tls):
    """sdk/typescript/test/ports.test.js against this daemon (the SDK trusts its certificate through FORKD_CA):
    getUrl once per port, listPorts without tokens, closePort by grant id and by port."""
    cert, _ = tls
    sb = Sandbox.create(template=BASE_TAG, controller=Controller(url=daemon.url, token=daemon.token))
    try:
        srv = _serve_in(rt.child(sb.id).netns)
        env = {**os.environ, "FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token, "FORKD_CA": str(cert),
               "FORKD_TEST_PORT_SANDBOX": sb.id, "FORKD_TEST_PORT": str(srv.server_port)}
        env.pop("NODE_EXTRA_CA_CERTS", None)
        res = subprocess.run(["node", "--test", "test/ports.test.js"], cwd=REPO / "sdk" / "typescript", env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "# pass 2" in res.stdout, res.stdout + res.stderr
    finally:
        sb.kill()
