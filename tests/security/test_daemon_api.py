"""Web page / local user -> daemon API (SECURITY.md section 6). Real `forkd serve` processes; the local attacker is
uid 65534 in a forked child; the "web page" is a client sending what a browser would (a foreign Host header after
DNS rebinding, a CORS-simple text/plain POST). No VMs: nothing here needs a guest."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from forkd.api.audit import Gate
from forkd.base.errors import Unavailable
from forkd.client.http import Call, Endpoint, SyncHttp
from forkd.core.audit import verify

NOBODY = 65534


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def home():
    """A FORKD_HOME other users may traverse (0711, under /tmp): the socket's own mode is what must stop them
    (pytest's tmp_path sits in a 0700 directory, which would make every local-user test pass vacuously)."""
    d = Path(tempfile.mkdtemp(prefix="forkd-sec-daemon-", dir="/tmp"))
    os.chmod(d, 0o711)
    yield d
    subprocess.run(["rm", "-rf", str(d), f"{d}.log", f"{d}.token"], check=False)


def spawn(home: Path, *args: str) -> subprocess.Popen:
    log = open(home.parent / f"{home.name}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "5", *args],
                            env=dict(os.environ, FORKD_HOME=str(home)), stdout=log, stderr=subprocess.STDOUT)


def log_of(home: Path) -> str:
    p = home.parent / f"{home.name}.log"
    return p.read_text()[-3000:] if p.exists() else ""


def unix(home: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(home / "forkd.sock")), base_url="http://forkd",
                        timeout=30)


def wait_up(proc: subprocess.Popen, home: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log_of(home)
        assert time.monotonic() < deadline, "daemon did not come up:\n" + log_of(home)
        try:
            with unix(home) as c:
                if c.get("/healthz").status_code == 200:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Tcp:
    """A daemon on loopback TCP with a token (and optionally TLS)."""

    def __init__(self, home: Path, *extra: str):
        self.home, self.port = home, free_port()
        self.token_file = home.parent / f"{home.name}.token"
        self.proc = spawn(home, "--bind", f"127.0.0.1:{self.port}", "--token-file", str(self.token_file), *extra)
        wait_up(self.proc, home)
        self.token = self.token_file.read_text().strip()

    def raw(self, request: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(request)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out


@pytest.fixture
def tcp(home):
    d = Tcp(home)
    yield d
    stop(d.proc)


# -- the local user and the unix socket ---------------------------------------------------------------------
def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _attack(sock: str, stop_fd: int) -> dict:
    """As uid 65534: connect to the socket in a tight loop until told to stop, keep every connection that got
    through, then try a request on each (the attack: connect in the window, use it after the chmod)."""
    held, seen = [], set()
    while not select.select([stop_fd], [], [], 0)[0]:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            held.append(s)
            if len(held) >= 50:
                break
        except OSError as exc:
            seen.add(exc.errno)
            s.close()
    working = 0
    for s in held:
        try:
            s.settimeout(5)
            s.sendall(b"POST /v1/pools HTTP/1.1\r\nHost: forkd\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 2\r\n\r\n{}")
            if s.recv(4096).startswith(b"HTTP/1.1"):
                working += 1
        except OSError:
            pass
    return {"held": len(held), "working": working, "errnos": sorted(seen)}


def _fork_attacker(sock: Path) -> tuple[int, int, int]:
    """(pid, read end of the result pipe, write end of the stop pipe)."""
    res_r, res_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(res_r)
            os.close(stop_w)
            _as_nobody()
            os.write(res_w, json.dumps(_attack(str(sock), stop_r)).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(res_w)
    os.close(stop_r)
    return pid, res_r, stop_w


def _attacker_result(pid: int, res_r: int, stop_w: int, after: float = 0.0) -> dict:
    time.sleep(after)
    try:
        os.write(stop_w, b"x")
    except BrokenPipeError:  # it stopped by itself (held enough connections)
        pass
    os.close(stop_w)
    data = b""
    while chunk := os.read(res_r, 65536):
        data += chunk
    os.close(res_r)
    _, status = os.waitpid(pid, 0)
    assert status == 0, "attacker child failed"
    return json.loads(data)


def test_local_user_racing_the_socket_never_gets_a_working_connection(home):
    """uid 65534 connects in a loop from before the daemon starts until after it answers: no connection it makes
    ever carries a request (the socket is born 0600 in a private directory; foreign peers are dropped)."""
    attacker = _fork_attacker(home / "forkd.sock")
    proc = spawn(home)
    try:
        wait_up(proc, home)
        got = _attacker_result(*attacker, after=0.5)
        print(got)
        assert got["working"] == 0, got
        assert errno.EACCES in got["errnos"], got  # it did reach the socket file: its mode stopped it
        assert (home / "forkd.sock").stat().st_mode & 0o777 == 0o600
        assert not any(verify_entries(home, "unix:65534"))
    finally:
        stop(proc)


def verify_entries(home: Path, actor: str) -> list[dict]:
    log = home / "audit.log"
    if not log.exists():
        return []
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("actor") == actor]


def test_foreign_uid_on_a_loosened_socket_gets_no_answer(home):
    """Variant: the operator (or a bug) makes the socket 0666; a foreign uid that connects is still dropped by
    its peer credentials (SO_PEERCRED), before any request is read."""
    proc = spawn(home)
    try:
        wait_up(proc, home)
        os.chmod(home / "forkd.sock", 0o666)
        got = _attacker_result(*_fork_attacker(home / "forkd.sock"), after=1.0)
        assert got["held"] > 0 and got["working"] == 0, got
        with unix(home) as c:  # the daemon's own uid still gets answers
            assert c.get("/healthz").status_code == 200
        assert not verify_entries(home, "unix:65534")
    finally:
        stop(proc)


# -- TCP: token, Host, content type, TLS ----------------------------------------------------------------------
def test_tcp_bind_without_token_is_refused_even_on_loopback(home):
    for bind in (f"127.0.0.1:{free_port()}", f"[::1]:{free_port()}", f"localhost:{free_port()}"):
        proc = spawn(home, "--bind", bind)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop(proc)
            pytest.fail(f"--bind {bind} without a token started a daemon")
        assert code == 2, log_of(home)
        assert "--token-file" in log_of(home)
        assert not (home / "forkd.sock").exists()


def test_dns_rebinding_foreign_host_is_refused(home):
    """A page at http://attacker.example:PORT whose name now resolves to 127.0.0.1 sends Host: attacker.example;
    refused (421) before auth or routing, with or without a token; the bound address and listed names pass."""
    d = Tcp(home, "--allow-host", "forkd.example")
    try:
        for auth in (b"", f"Authorization: Bearer {d.token}\r\n".encode()):
            for host in (b"attacker.example", b"attacker.example:%d" % d.port, b"127.0.0.1.nip.io", b""):
                out = d.raw(b"GET /version HTTP/1.1\r\nHost: " + host + b"\r\n" + auth + b"Connection: close\r\n\r\n")
                assert out.split(b"\r\n")[0] in (b"HTTP/1.1 421 Misdirected Request", b"HTTP/1.1 400 Bad Request"), \
                    (host, out[:200])
        for host in ("127.0.0.1", f"127.0.0.1:{d.port}", f"localhost:{d.port}", "forkd.example"):
            r = httpx.get(f"http://127.0.0.1:{d.port}/version", headers={"Host": host,
                                                                          "Authorization": f"Bearer {d.token}"})
            assert r.status_code == 200, (host, r.text)
    finally:
        stop(d.proc)


def test_text_plain_post_to_claim_is_refused_and_creates_nothing(tcp):
    """The CORS-simple content types (text/plain, forms) and bodies without a type never reach a mutating route."""
    doc = {"apiVersion": "forkd.dev/v1", "kind": "ForkPool", "metadata": {"name": "csrf"},
           "spec": {"parent": "nothing", "replicas": 1}}
    auth = {"Authorization": f"Bearer {tcp.token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{tcp.port}", headers=auth, timeout=30) as c, unix(tcp.home) as u:
        for client in (c, u):
            for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                          "multipart/form-data; boundary=x", None):
                for path, body in (("/v1/pools/csrf/claim", b'{"n": 1}'), ("/v1/pools/csrf/claim", b""),
                                   ("/v1/pools", json.dumps(doc).encode()), ("/v1/apply", b"{}")):
                    if ctype is None and not body:
                        continue
                    headers = {"Content-Type": ctype} if ctype else {}
                    r = client.post(path, content=body, headers=headers)
                    assert r.status_code == 415, (path, ctype, r.status_code, r.text)
                    assert "application/json" in r.json()["hint"]
        assert c.post("/v1/pools/csrf/claim", json={"n": 1}).status_code == 404  # JSON reaches the route
        files = "/v1/sandboxes/cnope/files"  # the raw upload: octet-stream or untyped (a PUT), never text/plain
        for ctype, code in (("text/plain", 415), ("application/octet-stream", 404), (None, 404)):
            headers = {"Content-Type": ctype} if ctype else {}
            assert c.put(files, params={"path": "/x"}, content=b"x", headers=headers).status_code == code, ctype
    assert not list((tcp.home / "objects").rglob("*.json"))
    assert not [p for p in (tcp.home / "children").iterdir() if not p.name.startswith(".")]


def _self_signed(where: Path) -> tuple[Path, Path]:
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=forkd",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    os.chmod(key, 0o600)
    return cert, key


def test_tls_end_to_end_with_ca_file(home, monkeypatch):
    certdir = Path(tempfile.mkdtemp(prefix="forkd-tls-", dir="/tmp"))
    d = None
    try:
        cert, key = _self_signed(certdir)
        d = Tcp(home, "--tls-cert", str(cert), "--tls-key", str(key))
        url = f"https://127.0.0.1:{d.port}"
        monkeypatch.setenv("FORKD_CA", str(cert))
        http = SyncHttp(Endpoint(url, None, d.token))
        assert http._send(Call("GET", "/version"))["api"] == "v1"
        http.close()
        monkeypatch.delenv("FORKD_CA")
        http = SyncHttp(Endpoint(url, None, d.token))
        with pytest.raises(Unavailable) as exc:  # a certificate nobody vouches for: refused, and we say why
            http._send(Call("GET", "/version"))
        assert "FORKD_CA" in (exc.value.hint or "")
        http.close()
        out = d.raw(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert not out.startswith(b"HTTP/1.1 200")  # plain HTTP on the TLS port gets nothing useful
    finally:
        if d is not None:
            stop(d.proc)
        subprocess.run(["rm", "-rf", str(certdir)], check=False)


def test_tls_needs_both_cert_and_key(home):
    """Half a TLS pair, a key others can read, or a certificate that does not load: refused at start (exit 2)."""
    certdir = Path(tempfile.mkdtemp(prefix="forkd-tls-", dir="/tmp"))
    cert, key = _self_signed(certdir)
    garbage = certdir / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = ((["--tls-cert", str(cert)], "--tls-key"), (["--tls-cert", str(cert), "--tls-key", str(key)], "readable"),
             (["--tls-cert", str(garbage), "--tls-key", str(key)], "do not load"))
    try:
        for i, (args, says) in enumerate(cases):
            os.chmod(key, 0o644 if says == "readable" else 0o600)
            proc = spawn(home, "--bind", f"127.0.0.1:{free_port()}", "--token-file", str(certdir / "tok"), *args)
            try:
                assert proc.wait(timeout=60) == 2, log_of(home)
            finally:
                stop(proc)
            assert says in log_of(home).split("forkd serve:")[-1], (i, log_of(home))
    finally:
        subprocess.run(["rm", "-rf", str(certdir)], check=False)


# -- the audit log under a flood ------------------------------------------------------------------------------
def test_unauthenticated_flood_grows_the_audit_log_by_a_bounded_amount(tcp):
    log = tcp.home / "audit.log"
    before = log.stat().st_size if log.exists() else 0
    with httpx.Client(base_url=f"http://127.0.0.1:{tcp.port}", timeout=30) as c:
        for i in range(200):
            r = c.post(f"/v1/pools/p{i}/claim", json={"n": 1},
                       headers={"Authorization": "Bearer wrong-wrong-wrong-wrong"} if i % 2 else {})
            assert r.status_code == 401
    grown = (log.stat().st_size if log.exists() else 0) - before
    assert grown < 2048, grown  # at most a summary line or two, not 200 fsynced lines
    stop(tcp.proc)  # shutdown writes the count of what the interval held back
    denied = [e for e in map(json.loads, log.read_text().splitlines()) if e["result"] == "denied"]
    assert sum(e.get("count", 1) for e in denied) == 200 and len(denied) <= 3
    assert verify(tcp.home).ok


# -- non-HTTP ASGI scopes ------------------------------------------------------------------------------------
def _run_ws(gate: Gate, scope_extra: dict) -> tuple[list, list]:
    import asyncio

    reached, sent = [], []

    async def inner(scope, receive, send):
        reached.append(scope["type"])
        await send({"type": "websocket.accept"})

    async def receive():
        return {"type": "websocket.connect"}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "websocket", "path": "/v1/anything", "headers": [(b"host", b"127.0.0.1")],
             "server": ("127.0.0.1", 8889), **scope_extra}
    asyncio.run(Gate(inner, token=gate.token, audit=None)(scope, receive, send))
    return reached, sent


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_websocket_scope_is_denied(transport):
    """The daemon serves no websocket: a websocket scope (with or without a token) never reaches the app."""
    token = "t" * 32
    for headers in ([], [(b"authorization", f"Bearer {token}".encode())]):
        extra = {"forkd.transport": transport} if transport == "tcp" else {}
        reached, sent = _run_ws(Gate(None, token=token, audit=None), {**extra, "headers": [(b"host", b"127.0.0.1"),
                                                                                           *headers]})
        assert reached == [] and sent and sent[0]["type"] == "websocket.close", (reached, sent)


def test_websocket_upgrade_on_tcp_is_not_accepted(tcp):
    out = tcp.raw(b"GET /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert not out.startswith(b"HTTP/1.1 101"), out[:200]


@pytest.mark.parametrize("bad", [0, -1, 30 * 86400 + 1, float("inf"), float("nan"), "forever", [1]])
def test_a_claims_lifetime_from_a_client_is_bounded(bad):
    """POST /v1/pools/{name}/claim {"lifetime_secs": ...} (the route validates with this model): no zero, negative,
    unbounded, non-finite or non-number lifetime reaches the registry; and no field beyond the model's."""
    from pydantic import ValidationError

    from forkd.client.wire import ClaimRequest
    with pytest.raises(ValidationError):
        ClaimRequest.model_validate({"n": 1, "lifetime_secs": bad})
    with pytest.raises(ValidationError):
        ClaimRequest.model_validate({"n": 1, "ttl": 5})
    assert ClaimRequest.model_validate({"n": 2, "lifetime_secs": 60}).lifetime_secs == 60


def test_a_child_id_from_a_client_is_checked_before_it_names_a_file(tcp):
    """Every /v1/sandboxes/{id} route reads the child's directory: an over-long, non-ASCII or dotted id is a 400
    that names the rule, never a 500 from the filesystem (a 256-byte id was ENAMETOOLONG, a 500, found by
    tests/test_schemathesis.py on 2026-12-02)."""
    auth = {"Authorization": f"Bearer {tcp.token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{tcp.port}", headers=auth, timeout=30) as c:
        for bad in ("0" * 27 + "\u0080" * 60 + "\u0130" * 40, "c" * 300, ".hidden", "c\u00e9"):
            for path in (f"/v1/sandboxes/{bad}", f"/v1/sandboxes/{bad}/logs"):
                r = c.get(path)
                assert r.status_code == 400, (path[:60], r.status_code, r.text[:300])
                assert "invalid child id" in r.json()["detail"] and "1-64 letters" in r.json()["hint"]
        assert c.get("/v1/sandboxes/cnope/logs").status_code == 404  # a well-formed id that does not exist
