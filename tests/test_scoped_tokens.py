"""Tokens scoped to a claim's children: minted from the daemon's bearer token (forkd.base.scoped_tokens), enforced
by the daemon's gate before routing (forkd.api.scoped). The pure parts are table-tested; the gate is tested on a
real daemon over TCP (no VM: the refusals happen before any child is looked up; the VM path, exec in a claimed
child with only the token, is tests/k8s/test_operator_span.py)."""

from __future__ import annotations

import httpx
import pytest

from forkd.api.scoped import allows
from forkd.base.scoped_tokens import children_of, mint
from tests.test_api import start_api_daemon, stop_api_daemon

BEARER = "b" * 44
KIDS = frozenset({"c-1", "c-2"})


def test_mint_and_check_round_trip():
    tok = mint(BEARER, ["c-2", "c-1", "c-1"], expires=2000, nonce="uid")
    assert children_of(tok, BEARER, now=1999) == KIDS
    assert tok == mint(BEARER, ["c-1", "c-2"], expires=2000, nonce="uid")  # deterministic: Secret written once
    assert children_of(tok, BEARER, now=2000) is None  # expired
    assert children_of(tok, "x" * 44, now=0) is None  # another daemon's (or a rotated) bearer token
    assert children_of(mint(BEARER, ["c-1"]), BEARER, now=1e12) == {"c-1"}  # 0: no expiry


@pytest.mark.parametrize("bad", [
    "", "fks1.", "fks1.a.b", "Bearer x", "fks1." + "A" * 9000 + ".x",
    "fks1..", "fks1.e30.AAAA",  # {} with a wrong mac
])
def test_malformed_tokens_open_nothing(bad):
    assert children_of(bad, BEARER, now=0) is None


def test_a_changed_payload_breaks_the_mac():
    head, payload, mac = mint(BEARER, ["c-1"]).split(".")
    import base64
    import json
    forged = base64.urlsafe_b64encode(json.dumps({"c": ["c-1", "other"], "e": 0, "n": ""}).encode()).decode()
    assert children_of(f"{head}.{forged.rstrip('=')}.{mac}", BEARER, now=0) is None


def test_mint_refuses_bad_ids():
    for ids in ([], ["../x"], ["a b"], [f"c{i}" for i in range(300)]):
        with pytest.raises(ValueError):
            mint(BEARER, ids)


ROUTES = [
    ("GET", "/v1/sandboxes/c-1", True),
    ("POST", "/v1/sandboxes/c-1/exec", True),
    ("POST", "/v1/sandboxes/c-2/eval", True),
    ("GET", "/v1/sandboxes/c-1/files/content", True),
    ("POST", "/v1/sandboxes/c-1/processes/7/stdin", True),
    ("POST", "/v1/sandboxes/c-1/ports", True),
    ("GET", "/healthz", True),
    ("POST", "/v1/sandboxes/c-3/exec", False),  # another child
    ("GET", "/v1/sandboxes", False),  # the list
    ("DELETE", "/v1/sandboxes/c-1", False),  # lifetime is the ForkClaim's
    ("POST", "/v1/sandboxes/c-1/timeout", False),
    ("POST", "/v1/sandboxes/c-1/fork", False),  # makes children outside the scope
    ("POST", "/v1/sandboxes/c-1/branch", False),
    ("POST", "/v1/apply", False),
    ("GET", "/v1/objects/ForkPool", False),
    ("POST", "/v1/children/c-1/exec", False),  # the native family: the bearer token's, not a claim's
    ("GET", "/v1/children/c-1", False),
    ("POST", "/v1/pools/p/claim", False),
    ("GET", "/v1/node", False),
]


@pytest.mark.parametrize("method,path,ok", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_what_a_scoped_token_may_call(method, path, ok):
    assert allows(method, path, KIDS) is ok


def test_the_gate_enforces_the_scope(tmp_path):
    """A real daemon over TCP: the scoped token passes the gate for its child only (404: no such child here, the
    route ran), is refused (403) elsewhere, and one minted from another bearer token is refused as any bad one."""
    home = tmp_path / "home"
    home.mkdir()
    d = start_api_daemon(home, tmp_path)
    try:
        tok = mint(d.token, ["c-1"])
        with httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {tok}"}, timeout=30) as c:
            assert c.get("/v1/sandboxes/c-1").status_code == 404  # through the gate, to the route
            assert c.post("/v1/sandboxes/c-1/exec", json={"cmd": ["true"]}).status_code not in (401, 403)
            for method, path in (("GET", "/v1/sandboxes/c-2"), ("GET", "/v1/sandboxes"), ("GET", "/v1/node"),
                                 ("DELETE", "/v1/sandboxes/c-1"), ("POST", "/v1/sandboxes/c-1/fork")):
                r = c.request(method, path)
                assert r.status_code == 403, (method, path, r.text)
                assert "scoped to sandboxes c-1" in r.json()["detail"]
        forged = mint("z" * 44, ["c-1"])
        r = httpx.get(d.url + "/v1/sandboxes/c-1", headers={"Authorization": f"Bearer {forged}"})
        assert r.status_code == 401
        assert httpx.get(d.url + "/v1/node", headers={"Authorization": f"Bearer {d.token}"}).status_code == 200
    finally:
        stop_api_daemon(d)
