"""The CLI's transport to a daemon (forkd.cli.daemon.Sender, under RemoteBackend): it retries as the SDK's senders do,
raises the SDK's error kinds, and quotes a path segment as httpx does. No VM: the daemon is tests.http_stub's
loopback server (503 before it answers), or a port nothing listens on."""

from __future__ import annotations

import random
import socket

import httpx
import pytest
from forkd_client.http import Call, quote

from forkd.base.errors import NotFound, Unavailable
from forkd.cli.daemon import Daemon, Sender
from tests.http_stub import Draining, serving


class Lost(Draining):
    busy = 0
    answers = {}


def sender(url: str, monkeypatch, attempts: int = 3) -> Sender:
    monkeypatch.setenv("FORKD_RETRY_ATTEMPTS", str(attempts))
    monkeypatch.setenv("FORKD_RETRY_WAIT", "0")
    return Sender(Daemon(url, None, None, None))


def test_a_503_is_sent_again_for_a_get_and_not_for_a_post(monkeypatch):
    with serving(Draining) as url:
        Draining.answers = {"/v1/x": ("application/json", b'{"ok": 1}')}
        s = sender(url, monkeypatch)
        assert s._send(Call("GET", "/v1/x")) == {"ok": 1}
        with pytest.raises(Unavailable, match="draining"):
            s._send(Call("POST", "/v1/x", json={}))
        assert Draining.seen == {("GET", "/v1/x"): 2, ("POST", "/v1/x"): 1}


def test_a_refused_connection_is_tried_attempts_times_then_unavailable(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    tries = []
    real = Daemon.send
    monkeypatch.setattr(Daemon, "send", lambda self, *a, **kw: tries.append(1) or real(self, *a, **kw))
    with pytest.raises(Unavailable, match="cannot reach the forkd daemon") as e:
        sender(dead, monkeypatch, attempts=3)._send(Call("POST", "/v1/children", json={}))
    assert len(tries) == 3 and e.value.hint and "forkd serve" in e.value.hint


def test_an_error_answer_is_the_sdks_kind_and_raw_and_parse_are_kept(monkeypatch):
    with serving(Lost) as url:
        Lost.answers = {"/v1/x": ("application/json", b'[1, 2]'), "/v1/raw": ("text/plain", b"\x00bytes")}
        s = sender(url, monkeypatch)
        assert s._send(Call("GET", "/v1/x", parse=len)) == 2
        assert s._send(Call("GET", "/v1/raw", raw=True)) == b"\x00bytes"
    # a 404 with problem+json: NotFound with its detail and hint (api_error, as the SDK's client raises it)
    d = Daemon("http://127.0.0.1:9", None, None, None)
    resp = type("R", (), {"status": 404, "read": lambda self: b'{"detail": "no child c1", "hint": "forkd ls"}'})()
    err = d._problem(resp, "/v1/children/c1")
    assert isinstance(err, NotFound) and err.message == "no child c1" and err.hint == "forkd ls"


def test_quote_encodes_a_segment_as_httpx_does_and_never_ends_the_path():
    chars = [chr(i) for i in range(0x21, 0x7F) if chr(i) not in "?#"] + [" ", "é", "\u00fc", "\U0001F600"]
    rng = random.Random(7)
    for _ in range(3000):
        seg = "".join(rng.choice(chars) for _ in range(rng.randint(0, 8))).lstrip("/")  # '//' would be a host
        assert quote(seg) == httpx.URL(f"/{seg}").raw_path.decode()[1:], seg
    assert quote("a?b#c") == "a%3Fb%23c" and quote("x\x00y") == "x%00y"
