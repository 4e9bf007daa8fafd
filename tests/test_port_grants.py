"""Port grants and the gate in front of a port's URL, without VMs (tests/test_ports.py drives real children)."""

from __future__ import annotations

import asyncio
import secrets
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from forkd.api.audit import Gate
from forkd.api.auth import TRANSPORT_KEY
from forkd.api.routes_ports import upstream_headers
from forkd.base.errors import NotFound
from forkd.core.ports import GRANTS, GRANTS_LOCK, MAX_GRANTS_FILE, PortGrants


def _child(tmp_path, cid: str, born: float) -> SimpleNamespace:
    """A child's record as the grants read it: its id, its directory, its creation time."""
    d = tmp_path / cid
    d.mkdir(exist_ok=True)
    return SimpleNamespace(id=cid, dir=str(d), created_at=born)


def test_a_token_opens_one_port_of_one_sandbox_until_revoked(tmp_path):
    g = PortGrants()
    ca, cb = _child(tmp_path, "ca", 1.0), _child(tmp_path, "cb", 2.0)
    a = g.grant(ca, 8000)
    assert g.grant(ca, 8000) == a  # the same grant while it stands
    b = g.grant(cb, 8000)
    assert g.check(ca, 8000, a.token) and g.check(cb, 8000, b.token)
    assert not g.check(cb, 8000, a.token) and not g.check(ca, 8001, a.token)  # other sandbox/port
    assert not g.check(ca, 8000, secrets.token_urlsafe(32)) and not g.check(ca, 8000, "")
    later = SimpleNamespace(id="ca", dir=ca.dir, created_at=9.0)
    assert not g.check(later, 8000, a.token)  # a later child under the same id is not the one granted
    assert [x.port for x in g.list(ca)] == [8000]
    assert g.revoke(ca, 8000) and not g.check(ca, 8000, a.token) and not g.revoke(ca, 8000)
    g.drop(cb)  # the child is gone
    assert not g.check(cb, 8000, b.token) and g.list(cb) == []
    assert g.grant(cb, 8000).token != b.token  # granted again: a new token


def test_grants_outlive_the_daemon_and_revoked_ones_stay_revoked(tmp_path):
    """A new PortGrants is what a restarted daemon has: it reads each child's grants from its directory."""
    ca = _child(tmp_path, "ca", 1.0)
    first = PortGrants()
    a, b = first.grant(ca, 8000), first.grant(ca, 8001)
    first.revoke(ca, 8001)
    again = PortGrants()
    assert again.check(ca, 8000, a.token) and again.grant(ca, 8000) == a
    assert not again.check(ca, 8001, b.token) and [x.port for x in again.list(ca)] == [8000]
    f = Path(ca.dir) / GRANTS
    assert f.stat().st_mode & 0o777 == 0o600  # tokens: for the daemon's user only
    assert not [p for p in Path(ca.dir).iterdir() if p.name not in (GRANTS, GRANTS_LOCK)]  # replaced, no temp left


@pytest.mark.parametrize("content", [b"[]", b"{not json", b'{"born": 1.0, "ports": []}',
                                     b'{"born": 1.0, "ports": {"80": 5, "x": "t"}}', b" " * (MAX_GRANTS_FILE + 1)])
def test_a_grants_file_that_is_not_ours_opens_nothing(tmp_path, content):
    ca = _child(tmp_path, "ca", 1.0)
    (Path(ca.dir) / GRANTS).write_bytes(content)
    g = PortGrants()
    assert g.list(ca) == [] and not g.check(ca, 80, "t") and not g.check(ca, 80, "5")
    assert g.grant(ca, 80).token  # and a grant replaces it


def test_a_child_whose_directory_is_gone_has_no_grants(tmp_path):
    ca = _child(tmp_path, "ca", 1.0)
    g = PortGrants()
    tok = g.grant(ca, 8000).token
    shutil.rmtree(ca.dir)
    assert not g.check(ca, 8000, tok) and g.list(ca) == []
    with pytest.raises(NotFound):
        g.grant(ca, 8000)


def test_the_guest_never_gets_the_daemons_bearer_token():
    got = dict(upstream_headers([("Authorization", "Bearer s3cret"), ("X-App", "1"), ("Host", "daemon:8889"),
                                 ("Connection", "keep-alive"), ("Content-Length", "99")], 8000, 5))
    assert "Authorization" not in got and got["X-App"] == "1"
    assert got["host"] == "localhost:8000" and got["content-length"] == "5" and "Host" not in got


def _through_gate(path: str, method: str = "GET", headers=(), routed: bool = True) -> tuple[int, list]:
    reached, sent, audited = [], [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        if routed:
            scope["route"] = type("Route", (), {"path": "/v1/ports/{id}/{port}/{token}/{path:path}"})()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class Audit:
        def append(self, *args, **kw):
            audited.append(args)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers), TRANSPORT_KEY: "tcp",
             "path_params": {"id": "ca", "port": 8000, "token": "T0KEN", "path": "x"}}
    asyncio.run(Gate(app, token="api-token", audit=Audit())(scope, None, send))
    return sent[0]["status"], reached + audited


def test_the_gate_lets_a_port_url_through_without_the_bearer_and_never_audits_its_token():
    status, seen = _through_gate("/v1/ports/ca/8000/T0KEN/x", "POST", [(b"content-type", b"text/plain")])
    assert status == 200 and "/v1/ports/ca/8000/T0KEN/x" in seen  # reached the route: its token decides
    assert not any("T0KEN" in str(a) for a in seen[1:]), seen  # the audit line names ca/8000/x only
    status, seen = _through_gate("/v1/ports/ca/8000/T0KEN/x", "DELETE", routed=False)  # no route matched it
    assert status == 200 and not any("T0KEN" in str(a) for a in seen[1:]), seen
    assert _through_gate("/v1/sandboxes")[0] == 401  # everything else still needs the bearer
    assert _through_gate("/v1/portsx/ca/8000/T0KEN/x")[0] == 401


def test_the_gate_admits_a_websocket_only_to_a_port_url_and_only_for_this_daemons_host():
    def ws(path: str, host: bytes = b"127.0.0.1") -> tuple[list, list]:
        reached, sent = [], []

        async def app(scope, receive, send):
            reached.append(scope["path"])

        async def send(message):
            sent.append(message)

        scope = {"type": "websocket", "path": path, "headers": [(b"host", host)], "server": ("127.0.0.1", 8889),
                 TRANSPORT_KEY: "tcp"}
        gate = Gate(app, token="api-token", audit=None, hosts=frozenset({"127.0.0.1", "localhost"}))
        asyncio.run(gate(scope, None, send))
        return reached, sent

    assert ws("/v1/ports/ca/8002/T0KEN/chat")[0] == ["/v1/ports/ca/8002/T0KEN/chat"]  # its route checks the grant
    for path, host in (("/v1/sandboxes", b"127.0.0.1"), ("/v1/ports/ca/8002/T0KEN/chat", b"evil.example")):
        reached, sent = ws(path, host)
        assert reached == [] and sent[0]["type"] == "websocket.close", (path, host, sent)
