"""A sandbox's TCP port reached from the host through the daemon: real `python3 -m http.server` in real isolated
children, a real daemon on loopback TCP (bearer token), the SDK's get_url / get_host / close_port.

The port URL works without the daemon's bearer token (its grant's token is in the path), for that port of that
sandbox only; a wrong or missing token, another sandbox's token, a port not opened, a revoked grant and a dead
child all get 404. The daemon's bearer token is never forwarded.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest
from forkd_client import NotFound

from forkd.sdk import Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.test_api import start_api_daemon, stop_api_daemon

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1800)]  # two children and their servers under TCG

ECHO = """
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        out = json.dumps({"path": self.path, "body": body.decode(), "headers": dict(self.headers)}).encode()
        self.send_response(201); self.send_header("content-length", str(len(out))); self.end_headers()
        self.wfile.write(out)
http.server.HTTPServer(("0.0.0.0", 8001), H).serve_forever()
"""
WS_ECHO = """
import base64, hashlib, socket, struct, threading
def serve(c):
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        data += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in data.split(b"\\r\\n") if l.lower().startswith(b"sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
              b"Sec-WebSocket-Accept: " + accept + b"\\r\\n\\r\\n")
    path = data.split(b" ")[1]
    def read(n):
        b = b""
        while len(b) < n:
            x = c.recv(n - len(b))
            if not x:
                raise EOFError
            b += x
        return b
    while True:
        h = read(2); op, n = h[0] & 15, h[1] & 127
        n = struct.unpack(">H", read(2))[0] if n == 126 else struct.unpack(">Q", read(8))[0] if n == 127 else n
        mask = read(4) if h[1] & 128 else bytes(4)
        p = bytes(x ^ mask[i % 4] for i, x in enumerate(read(n)))
        if op == 8:
            c.sendall(b"\\x88\\x02" + p[:2]); return
        if op == 1:
            p = b"echo " + path + b" " + p
        head = bytes([0x80 | op, len(p)]) if len(p) < 126 else bytes([0x80 | op, 126]) + struct.pack(">H", len(p))
        c.sendall(head + p)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 8002)); s.listen(8)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
LISTENING = ("for i in $(seq 300); do python3 -c 'import socket,sys; socket.create_connection((\"127.0.0.1\", "
             "int(sys.argv[1])), 1)' {port} 2>/dev/null && exit 0; sleep 0.1; done; exit 1")


@pytest.fixture(scope="module")
def daemon(home, base, rt, tmp_path_factory):
    from tests.test_isolation import net_snapshot

    net_snapshot(rt)
    d = start_api_daemon(home, tmp_path_factory.mktemp("ports"))
    yield d
    stop_api_daemon(d)


def _serve(sb: Sandbox, name: str) -> None:
    """http.server on 8000 serving /root/srv (hello.txt says `name`), an HTTP echo on 8001, a WebSocket echo on
    8002 (stdlib only, as the guest has); all listening."""
    sb.commands.run("mkdir -p /root/srv")
    sb.files.write("/root/srv/hello.txt", f"hello from {name}")
    sb.files.write("/root/echo.py", ECHO)
    sb.commands.run("cd /root/srv && exec python3 -m http.server 8000", background=True, timeout=None)
    sb.commands.run("exec python3 /root/echo.py", background=True, timeout=None)  # (the default 60 s kills)
    sb.files.write("/root/ws.py", WS_ECHO)
    sb.commands.run("exec python3 /root/ws.py", background=True, timeout=None)
    for port in (8000, 8001, 8002):
        sb.commands.run(LISTENING.format(port=port), timeout=300)  # TCG under load: servers start slowly


def _ws(url: str, texts: list[str], cafile: Path | None = None) -> tuple[int, list[str]]:
    """A WebSocket client (wsproto; over TLS trusting `cafile` when given): (the handshake's status, the replies
    to `texts`)."""
    import socket
    import ssl
    from urllib.parse import urlsplit

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, CloseConnection, Message, RejectConnection, Request, TextMessage

    u = urlsplit(url)
    conn, got = WSConnection(ConnectionType.CLIENT), []
    raw = socket.create_connection((u.hostname, u.port), timeout=60)
    if cafile is not None:
        raw = ssl.create_default_context(cafile=cafile).wrap_socket(raw, server_hostname=u.hostname)
    with raw as s:
        s.sendall(conn.send(Request(host=u.netloc, target=u.path + (f"?{u.query}" if u.query else ""))))
        status, sent = 0, False
        while len(got) < len(texts):
            conn.receive_data(s.recv(65536) or None)
            for ev in conn.events():
                if isinstance(ev, AcceptConnection):
                    status = 101
                elif isinstance(ev, RejectConnection):
                    return ev.status_code, got
                elif isinstance(ev, TextMessage):
                    got.append(ev.data)
            if status == 101 and not sent:
                s.sendall(b"".join(conn.send(Message(data=t)) for t in texts))
                sent = True
        s.sendall(conn.send(CloseConnection(code=1000)))
    return status, got


def test_a_port_through_the_daemon(daemon):
    from tests.test_isolation import NET_TAG

    ctrl = Controller(url=daemon.url, token=daemon.token)
    a = Sandbox.create(template=NET_TAG, timeout=3600, controller=ctrl)  # (setting up servers takes minutes)
    b = Sandbox.create(template=NET_TAG, timeout=3600, controller=ctrl)
    try:
        _serve(a, "a")
        _serve(b, "b")
        url_a, url_b = a.get_url(8000), b.get_url(8000)
        assert url_a.startswith(daemon.url + "/v1/ports/" + a.id + "/8000/") and a.get_host(8000) == url_a[7:]
        web = httpx.Client(timeout=60)  # no bearer token: the grant's token is the key
        assert web.get(url_a + "hello.txt").text == "hello from a"
        assert web.get(url_b + "hello.txt").text == "hello from b"
        assert web.get(url_a + "missing").status_code == 404 and "Error response" in web.get(url_a + "missing").text
        token_a = url_a.rstrip("/").rsplit("/", 1)[1]
        base = f"{daemon.url}/v1/ports"
        refused = {
            "wrong token": f"{base}/{a.id}/8000/{secrets.token_urlsafe(32)}/hello.txt",
            "no token": f"{base}/{a.id}/8000/hello.txt",
            "a's token on b": f"{base}/{b.id}/8000/{token_a}/hello.txt",
            "a port not opened": f"{base}/{a.id}/8001/{token_a}/",
        }
        for why, url in refused.items():
            r = web.get(url, follow_redirects=True)  # (a path without the token is redirected to one with a slash)
            assert r.status_code == 404 and "hello from" not in r.text, (why, r.status_code, r.text)

        echo = a.get_url(8001)
        r = web.post(echo + "p?q=1", content=b"body!", headers={"Authorization": f"Bearer {daemon.token}",
                                                               "Content-Type": "text/plain", "X-App": "kept"})
        seen = r.json()
        assert r.status_code == 201 and seen["path"] == "/p?q=1" and seen["body"] == "body!", seen
        hdrs = {k.lower(): v for k, v in seen["headers"].items()}
        assert "authorization" not in hdrs and hdrs["x-app"] == "kept" and hdrs["host"] == "localhost:8001", hdrs
        assert {g.port for g in ctrl.list_ports(a.id)} == {8000, 8001}

        ws_url = a.get_url(8002)
        assert _ws(ws_url + "chat?x=1", ["hi", "there"]) == (101, ["echo /chat?x=1 hi", "echo /chat?x=1 there"])
        ws_token = ws_url.rstrip("/").rsplit("/", 1)[1]
        assert _ws(ws_url.replace(ws_token, "x" * 43) + "chat", ["hi"])[0] == 403  # a wrong token: no upgrade
        b_ws = ws_url.replace(f"/{a.id}/", f"/{b.id}/")  # a's token on b's port
        assert _ws(b_ws + "chat", ["hi"])[0] == 403

        a.close_port(8000)  # revoked: the URL stops working, b's does not
        assert web.get(url_a + "hello.txt").status_code == 404
        assert web.get(url_b + "hello.txt").text == "hello from b"
        cli = forkd_cli_env({"FORKD_URL": daemon.url, "FORKD_TOKEN": daemon.token}, "port", a.id, "8000", "-o",
                            "json")  # `forkd port`: opened again, with a new token
        assert cli.returncode == 0, cli.stderr
        url_cli = json.loads(cli.stdout)["url"]
        assert url_cli != url_a and web.get(url_cli + "hello.txt").text == "hello from a"
        url_b2 = b.get_url(8000)
        assert url_b2 == url_b  # the same grant while it stands
        b.kill()  # its ports go with it
        assert web.get(url_b + "hello.txt").status_code == 404
    finally:
        for sb in (a, b):
            try:
                sb.kill()
            except NotFound:
                pass


def test_opening_a_port_needs_the_bearer_and_the_daemon(daemon):
    """(A child without a NIC has ports too, relayed by its agent: tests/test_ports_relay.py.)"""
    ctrl = Controller(url=daemon.url, token=daemon.token)
    with Sandbox.create(template=BASE_TAG, controller=ctrl) as sb:
        r = httpx.post(f"{daemon.url}/v1/sandboxes/{sb.id}/ports", json={"port": 8000})  # no bearer
        assert r.status_code == 401
        assert ctrl.list_ports(sb.id) == []
    cli = forkd_cli_env({"FORKD_NO_DAEMON": "1"}, "port", "c123", "8000")
    assert cli.returncode == 6 and "needs the daemon" in cli.stderr, cli.stderr


def forkd_cli_env(env: dict[str, str], *args: str):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
