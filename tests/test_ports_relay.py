"""Ports of children without a network device, relayed by their guest agent: real servers in real children (no
NIC, no egress), a real daemon on loopback TCP (bearer token), the SDK's get_url, a WebSocket client and
`forkd port-forward` for raw TCP. Grants outlive a daemon restart; a revoked one stays revoked; a guest that lies
on the relay is stopped and the daemon serves on (SECURITY.md: ports)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time

import httpx
import pytest
from forkd_client import NotFound

from forkd.sdk import Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.test_api import start_api_daemon, stop_api_daemon
from tests.test_ports import ECHO, WS_ECHO, _ws

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1800)]  # several children and servers under TCG

TCP_ECHO = """
import socket, threading
def serve(c):
    while True:
        b = c.recv(65536)
        if not b:
            c.close(); return
        c.sendall(b)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 8003)); s.listen(8)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
SERVERS = f"""
import functools, http.server, threading
for code in ({ECHO!r}, {WS_ECHO!r}, {TCP_ECHO!r}):
    threading.Thread(target=exec, args=(code, {{"__name__": "server"}}), daemon=True).start()
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/root/srv")
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), handler).serve_forever()
"""
# only the file server on 8000 (its `hello.txt`): for the tests that reach nothing else
HTTP_ONLY = """
import functools, http.server
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/root/srv")
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), handler).serve_forever()
"""
LISTENING = """
import socket, time
for port in {ports!r}:
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.2)
"""
# run in the victim's agent process (exec_code runs there): find its port and op table, to replace its tcp_read
HOSTILE = '''
import os, struct, sys
_f = sys._getframe()
while "port" not in _f.f_locals:
    _f = _f.f_back
_port, _ops = _f.f_locals["port"], _f.f_globals["OPS"]
def _raw(b):
    if not hasattr(_port, "fd"):  # the fake driver's guest: its port is a unix socket connection
        return _port.conn.sendall(b)
    v = memoryview(b)
    while v:
        v = v[os.write(_port.fd, v):]
'''
LIES = {
    "more bytes than asked": 'lambda a: {"data": "QUFB" * (1 << 18), "eof": False}',
    "a misshapen reply": 'lambda a: {"data": ["not", "base64"], "eof": "no"}',
    "a 4 GiB frame header": 'lambda a: _raw(b"garbage" + b"FKD1" + struct.pack(">I", 0xFFFFFFFF) + bytes(1 << 16))',
}


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("relay")
    d = start_api_daemon(home, tmp)
    d.tmp = tmp
    yield d
    stop_api_daemon(d)


def _sandbox(daemon) -> Sandbox:
    sb = Sandbox.create(template=BASE_TAG, timeout=3600,  # TCG under load: setting up servers takes minutes
                        controller=Controller(url=daemon.url, token=daemon.token))
    assert sb.controller.get_sandbox(sb.id).netns is None  # no NIC: only the agent reaches it
    return sb


def _serve(sb: Sandbox, name: str, only_http: bool = False) -> None:
    """http.server on 8000 (serving /root/srv; hello.txt says `name`), an HTTP echo on 8001, a WebSocket echo on
    8002, a TCP echo on 127.0.0.1:8003: one guest process (each a thread: TCG starts processes slowly); all
    listening. `only_http`: the file server on 8000 alone (the others' imports cost a TCG guest seconds)."""
    sb.commands.run("mkdir -p /root/srv")
    sb.files.write("/root/srv/hello.txt", f"hello from {name}")
    sb.files.write("/root/servers.py", HTTP_ONLY if only_http else SERVERS)
    sb.commands.run("exec python3 /root/servers.py", background=True, timeout=None)
    ports = (8000,) if only_http else (8000, 8001, 8002, 8003)
    sb.commands.run(["python3", "-c", LISTENING.format(ports=ports)], timeout=300)  # one interpreter polls them


def _kill(*sbs: Sandbox) -> None:
    for sb in sbs:
        try:
            sb.kill()
        except NotFound:
            pass


def test_http_and_websocket_reach_a_child_without_a_nic(daemon):
    a, b = _sandbox(daemon), _sandbox(daemon)
    try:
        _serve(a, "a")
        _serve(b, "b")
        url_a, url_b = a.get_url(8000), b.get_url(8000)
        web = httpx.Client(timeout=120)  # no bearer token: the grant's token is the key
        assert web.get(url_a + "hello.txt").text == "hello from a"
        assert web.get(url_b + "hello.txt").text == "hello from b"
        big = secrets.token_bytes(3 << 20)  # many relay chunks each way
        a.files.write("/root/srv/big.bin", big)
        assert web.get(url_a + "big.bin").content == big
        r = web.post(a.get_url(8001) + "p?q=1", content=b"body!", headers={"Authorization": "Bearer x"})
        seen = r.json()
        assert r.status_code == 201 and seen["path"] == "/p?q=1" and seen["body"] == "body!", seen
        assert "authorization" not in {k.lower() for k in seen["headers"]}

        token_a = url_a.rstrip("/").rsplit("/", 1)[1]
        base = f"{daemon.url}/v1/ports"
        refused = {
            "wrong token": f"{base}/{a.id}/8000/{secrets.token_urlsafe(32)}/hello.txt",
            "no token": f"{base}/{a.id}/8000/hello.txt",
            "a's token on b": f"{base}/{b.id}/8000/{token_a}/hello.txt",
            "a port not opened": f"{base}/{a.id}/8003/{token_a}/",
        }
        for why, url in refused.items():
            r = web.get(url, follow_redirects=True)
            assert r.status_code == 404 and "hello from" not in r.text, (why, r.status_code, r.text)

        ws_url = a.get_url(8002)
        assert _ws(ws_url + "chat", ["hi", "there"]) == (101, ["echo /chat hi", "echo /chat there"])
        ws_token = ws_url.rstrip("/").rsplit("/", 1)[1]
        assert _ws(ws_url.replace(ws_token, "x" * 43) + "chat", ["hi"])[0] == 403
        assert _ws(ws_url.replace(f"/{a.id}/", f"/{b.id}/") + "chat", ["hi"])[0] == 403
        b.kill()  # its ports go with it
        assert web.get(url_b + "hello.txt").status_code == 404
    finally:
        _kill(a, b)


def _port_forward(daemon, child: str, port: int) -> tuple[subprocess.Popen, tuple[str, int]]:
    proc = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "port-forward", child, str(port), "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token})
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no line"
    host, port_ = json.loads(line)["listen"].rsplit(":", 1)
    return proc, (host, int(port_))


def _echo(addr: tuple[str, int], payload: bytes) -> bytes:
    with socket.create_connection(addr, timeout=120) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        got = bytearray()
        while chunk := s.recv(1 << 16):
            got += chunk
    return bytes(got)


def test_raw_tcp_through_port_forward(daemon):
    """A TCP echo listening on the guest's 127.0.0.1 only, reached by `forkd port-forward`: bytes both ways, a
    half-close passed on, two connections at once."""
    sb = _sandbox(daemon)
    try:
        _serve(sb, "tcp")
        proc, addr = _port_forward(daemon, sb.id, 8003)
        try:
            payload = secrets.token_bytes(1 << 20)
            assert _echo(addr, payload) == payload
            with socket.create_connection(addr, timeout=120) as one, socket.create_connection(addr, timeout=120) as two:
                one.sendall(b"one")
                two.sendall(b"two")
                assert two.recv(3) == b"two" and one.recv(3) == b"one"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        _kill(sb)


def test_grants_survive_a_daemon_restart_and_revoked_ones_stay_revoked(daemon, home):
    sb = _sandbox(daemon)
    try:
        _serve(sb, "kept")
        kept, gone = sb.get_url(8000), sb.get_url(8001)
        sb.close_port(8001)
        stop_api_daemon(daemon)
        again = start_api_daemon(home, daemon.tmp)  # the same home and token file, another TCP port
        daemon.proc, daemon.url = again.proc, again.url
        path = kept.split("/v1/ports/", 1)[1]
        r = httpx.get(f"{again.url}/v1/ports/{path}hello.txt", timeout=120)
        assert r.status_code == 200 and r.text == "hello from kept", (r.status_code, r.text)
        path = gone.split("/v1/ports/", 1)[1]
        assert httpx.post(f"{again.url}/v1/ports/{path}x", content=b"x", timeout=120).status_code == 404
        ctrl = Controller(url=again.url, token=again.token)
        assert [g.port for g in ctrl.list_ports(sb.id)] == [8000]
    finally:
        sb.controller = Controller(url=daemon.url, token=daemon.token)  # the restarted daemon's address
        _kill(sb)


def _settled(rt, child_id: str, within: float = 120.0):
    """The child's record once it has left `running`: the relay's reader records the child failed as it quarantines
    it, while the relay's other pump, which saw the shared connection cut, may have ended the client's request a
    moment before."""
    deadline = time.monotonic() + within
    while (rec := rt.child(child_id)).status == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    return rec


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_guest_that_lies_on_the_relay_is_stopped_and_the_daemon_serves_on(daemon, rt, lie):
    victim, bystander = _sandbox(daemon), _sandbox(daemon)
    try:
        for sb in (victim, bystander):
            _serve(sb, sb.id, only_http=True)  # the lie is told on the relay of port 8000
        url_v, url_b = victim.get_url(8000), bystander.get_url(8000)
        victim.controller.eval_code(victim.id, HOSTILE + f"_ops['tcp_read'] = {LIES[lie]}\n", mode="exec")
        try:
            r = httpx.get(url_v + "hello.txt", timeout=120)
            assert r.status_code >= 500 or r.text != f"hello from {victim.id}", (r.status_code, r.text)
        except httpx.HTTPError:
            pass  # the answer was cut: the relay ended with the child
        rec = _settled(rt, victim.id)
        assert rec.status == "failed" and "misbehaved" in (rec.error or ""), rec
        assert httpx.get(url_b + "hello.txt", timeout=120).text == f"hello from {bystander.id}"
        assert httpx.get(f"{daemon.url}/healthz", timeout=30).status_code == 200
    finally:
        _kill(victim, bystander)
