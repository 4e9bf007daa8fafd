"""Port grants and the gate in front of a port's URL, without VMs (tests/test_ports.py drives real children)."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from forkd.api.audit import Gate
from forkd.api.auth import TRANSPORT_KEY
from forkd.api.routes_ports import upstream_headers
from forkd.base.errors import Conflict, NotFound
from forkd.core.ports import (
    GRANTS,
    GRANTS_LOCK,
    MAX_GRANTS_FILE,
    MAX_GRANTS_PER_SANDBOX,
    PortGrants,
    digest,
    is_grant_id,
)


def _child(tmp_path, cid: str, born: float) -> SimpleNamespace:
    """A child's record as the grants read it: its id, its directory, its creation time."""
    d = tmp_path / cid
    d.mkdir(exist_ok=True)
    return SimpleNamespace(id=cid, dir=str(d), created_at=born)


def test_a_token_opens_one_port_of_one_sandbox_until_revoked(tmp_path):
    g = PortGrants()
    ca, cb = _child(tmp_path, "ca", 1.0), _child(tmp_path, "cb", 2.0)
    a, a2 = g.grant(ca, 8000), g.grant(ca, 8000)
    assert a.token != a2.token and a.id != a2.id  # each open: a grant of its own
    b = g.grant(cb, 8000)
    assert g.check(ca, 8000, a.token) and g.check(ca, 8000, a2.token) and g.check(cb, 8000, b.token)
    assert not g.check(cb, 8000, a.token) and not g.check(ca, 8001, a.token)  # other sandbox/port
    assert not g.check(ca, 8000, secrets.token_urlsafe(32)) and not g.check(ca, 8000, "")
    assert not g.check(ca, 8000, a.token + "x") and not g.check(ca, 8000, a.token[:-1])
    later = SimpleNamespace(id="ca", dir=ca.dir, created_at=9.0)
    assert not g.check(later, 8000, a.token)  # a later child under the same id is not the one granted
    assert sorted(x.id for x in g.list(ca)) == sorted([a.id, a2.id])
    assert [x.id for x in g.revoke(ca, a.id)] == [a.id]  # by id: that one only
    assert not g.check(ca, 8000, a.token) and g.check(ca, 8000, a2.token) and g.revoke(ca, a.id) == []
    assert [x.id for x in g.revoke(ca, "8000")] == [a2.id] and not g.check(ca, 8000, a2.token)  # by port: all
    g.drop(cb)  # the child is gone
    assert not g.check(cb, 8000, b.token) and g.list(cb) == []
    assert g.grant(cb, 8000).token != b.token  # granted again: a new token


def test_no_token_is_kept_or_listed_in_clear(tmp_path):
    """The token is given once; the file keeps its hash, bound to the sandbox and port, and the listing none."""
    ca = _child(tmp_path, "ca", 1.0)
    g = PortGrants()
    made = [g.grant(ca, p) for p in (8000, 8000, 8001)]
    kept = (Path(ca.dir) / GRANTS).read_text()
    for m in made:
        assert m.token and m.token not in kept and m.token[:16] not in kept, kept
        assert digest("ca", m.port, m.token) in kept
    assert digest("cb", 8000, made[0].token) not in kept and digest("ca", 8001, made[0].token) not in kept
    listed = g.list(ca)
    assert [x.token for x in listed] == [None] * 3 and [x.port for x in listed] == [8000, 8000, 8001]
    assert {x.id for x in listed} == {m.id for m in made} and all(is_grant_id(x.id) for x in listed)


def test_grants_outlive_the_daemon_and_revoked_ones_stay_revoked(tmp_path):
    """A new PortGrants is what a restarted daemon has: it reads each child's grants (hashes) from its
    directory."""
    ca = _child(tmp_path, "ca", 1.0)
    first = PortGrants()
    a, b = first.grant(ca, 8000), first.grant(ca, 8001)
    first.revoke(ca, b.id)
    again = PortGrants()
    assert again.check(ca, 8000, a.token) and [x.id for x in again.list(ca)] == [a.id]
    assert not again.check(ca, 8001, b.token) and [x.port for x in again.list(ca)] == [8000]
    f = Path(ca.dir) / GRANTS
    assert f.stat().st_mode & 0o777 == 0o600  # hashes of tokens: for the daemon's user only
    assert not [p for p in Path(ca.dir).iterdir() if p.name not in (GRANTS, GRANTS_LOCK)]  # replaced, no temp left


def test_an_older_daemons_tokens_in_clear_keep_working_and_leave_the_file(tmp_path):
    """A grants file an older daemon wrote (port -> token in clear): its URLs still open, and the first read
    replaces it with the tokens' hashes."""
    ca = _child(tmp_path, "ca", 1.0)
    old = secrets.token_urlsafe(32)
    (Path(ca.dir) / GRANTS).write_text(json.dumps({"born": 1.0, "ports": {"8000": old}}))
    g = PortGrants()
    assert g.check(ca, 8000, old) and not g.check(ca, 8001, old)
    assert old not in (Path(ca.dir) / GRANTS).read_text()
    (listed,) = g.list(ca)
    assert listed.port == 8000 and listed.token is None and g.check(ca, 8000, old)
    assert g.revoke(ca, listed.id) and not g.check(ca, 8000, old)


def test_a_sandbox_has_a_bounded_number_of_grants(tmp_path):
    ca = _child(tmp_path, "ca", 1.0)
    g = PortGrants()
    first = [g.grant(ca, 8000) for _ in range(MAX_GRANTS_PER_SANDBOX)]
    with pytest.raises(Conflict, match="revoke"):
        g.grant(ca, 8001)
    g.revoke(ca, first[0].id)
    assert g.check(ca, 8001, g.grant(ca, 8001).token)


def _file(grants: dict) -> bytes:
    return json.dumps({"born": 1.0, "grants": grants}).encode()


GOOD = {"port": 80, "sha256": digest("ca", 80, "t"), "at": 1.0}


@pytest.mark.parametrize("content", [
    b"[]", b"{not json", b'{"born": 1.0, "ports": []}', b'{"born": 1.0, "ports": {"80": 5, "x": "t"}}',
    b" " * (MAX_GRANTS_FILE + 1), _file([]),
    _file({"80": GOOD}), _file({"g" + "0" * 15: GOOD}), _file({"g" + "Z" * 16: GOOD}),  # not a grant id
    _file({"g" + "0" * 16: {**GOOD, "port": "80"}}), _file({"g" + "0" * 16: {**GOOD, "port": 0}}),
    _file({"g" + "0" * 16: {**GOOD, "sha256": "t"}}), _file({"g" + "0" * 16: {**GOOD, "token": "t"}}),
    json.dumps({"born": 2.0, "grants": {"g" + "0" * 16: GOOD}}).encode(),  # another child under the same id
])
def test_a_grants_file_that_is_not_ours_opens_nothing(tmp_path, content):
    ca = _child(tmp_path, "ca", 1.0)
    (Path(ca.dir) / GRANTS).write_bytes(content)
    g = PortGrants()
    assert g.list(ca) == [] and not g.check(ca, 80, "t") and not g.check(ca, 80, "5")
    assert g.grant(ca, 80).token  # and a grant replaces it


def test_a_well_formed_grants_file_opens_its_port(tmp_path):
    """(The control of the table above: the same file, well formed, opens port 80 with the token "t".)"""
    ca = _child(tmp_path, "ca", 1.0)
    (Path(ca.dir) / GRANTS).write_bytes(_file({"g" + "0" * 16: GOOD}))
    assert PortGrants().check(ca, 80, "t") and not PortGrants().check(ca, 81, "t")


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
