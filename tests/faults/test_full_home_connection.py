"""A refusal for lack of space keeps the client's connection: the next request on it is answered.

The soak's full-home fault saw a layer build, sent right after a live branch refused for lack of space, fail with
"Connection reset by peer": the refusal had gone through Starlette's catch-all, which answers and then re-raises to
uvicorn, which drops the kept-alive connection the client had already sent its next request on. Here against a
real daemon (`forkd serve`) whose $FORKD_HOME is a small loop-mounted ext4 the test fills; needs root (mount)."""

from __future__ import annotations

import http.client
import json
import os
import socket

import pytest
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.paths import Layout
from forkd.service import Service
from tests.chaos.rig import Rig
from tests.faults.mounts import fill, loop_ext4

POOL = {"kind": "ForkPool", "metadata": {"name": "full"}, "spec": {"from": "p", "warm": 1}}


class UnixConnection(http.client.HTTPConnection):
    """One kept-alive HTTP/1.1 connection to a unix socket; `opened` counts the sockets it connected."""

    def __init__(self, path: str):
        super().__init__("forkd", timeout=120)
        self.path, self.opened = path, 0

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)
        self.opened += 1

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        self.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = self.getresponse()
        return r.status, json.loads(r.read())


@pytest.mark.faults
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a loop filesystem needs root")
def test_a_refusal_for_lack_of_space_keeps_the_connection_for_the_next_request(tmp_path):
    with loop_ext4(32) as mnt:
        rig = Rig.create(home=mnt / "home")
        rig.log_path = tmp_path / "daemon.log"  # not on the filesystem filled
        try:
            rig.start_daemon()
            conn = UnixConnection(str(rig.home / "forkd.sock"))
            filler = fill(mnt)
            status, body = conn.post("/v1/pools", POOL)
            assert status == 503 and "No space left on device" in body["detail"], body
            filler.unlink()
            # sent on the same connection; before the fix: ConnectionResetError (or RemoteDisconnected)
            status, body = conn.post("/v1/pools", POOL)
            assert status < 300, body
            assert conn.opened == 1
            assert "Exception in ASGI application" not in rig.daemon_log_tail(100_000)  # an answer, not a crash
        finally:
            rig.destroy()


def test_an_internal_error_tells_the_client_to_close_the_connection(tmp_path):
    """The catch-all's answer (the server drops the connection after it) says `Connection: close`, so no client
    sends another request on it. The failing route is the test's own."""
    app = create_app(Service.on(Layout(tmp_path / "home")))

    @app.get("/test-fails")
    def fails() -> None:
        raise RuntimeError("the route failed")

    r = TestClient(app, raise_server_exceptions=False).get("/test-fails")
    assert r.status_code == 500 and r.json()["title"] == "InternalError", r.text
    assert r.headers["connection"] == "close"
