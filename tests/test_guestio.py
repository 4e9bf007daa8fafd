"""The daemon's guest pool (forkd.api.guestio) on its own: slots are per child and per client, refused past a limit
with a message naming which, and given back however a call ends (an answer, an error before the first byte, a
stream read to its end or left half-read). The work behind each call is a blocking iterator the test controls (the
guest's part); the gate is the real one, in a real app. No VMs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from starlette.testclient import TestClient

from forkd.api.guestio import GuestIO
from forkd.base.errors import Busy, NotFound


def app_with(gate: GuestIO, go: threading.Event) -> FastAPI:
    app = FastAPI()

    def chunks(n: int) -> Iterator[bytes]:
        for i in range(n):
            go.wait(30)
            yield b"%d\n" % i

    @app.get("/stream/{child}")
    async def stream(request: Request, child: str, n: int = 3):
        return await gate.respond(child, request, lambda: chunks(n), "text/plain")

    @app.get("/missing/{child}")
    async def missing(request: Request, child: str):
        def make() -> Iterator[bytes]:
            raise NotFound(f"no such file in {child}")
        return await gate.respond(child, request, make, "text/plain")

    @app.get("/call/{child}")
    async def call(request: Request, child: str):
        return {"v": await gate.run(child, request, lambda: 42)}

    @app.exception_handler(NotFound)
    async def nf(_, exc):
        from fastapi.responses import JSONResponse
        return JSONResponse({"detail": exc.message}, status_code=404)
    return app


def test_limits_name_the_child_or_the_client_and_slots_come_back():
    gate = GuestIO(threads=4, per_child=2, per_client=3)
    gate.acquire("a", "c1")
    gate.acquire("a", "c2")
    with pytest.raises(Busy, match="child a already has 2 guest calls in flight"):
        gate.acquire("a", "c3")
    gate.acquire("b", "c1")
    gate.acquire("c", "c1")
    with pytest.raises(Busy, match="client c1 already has 3 .* child d was refused"):
        gate.acquire("d", "c1")
    for child, client in (("a", "c1"), ("a", "c2"), ("b", "c1"), ("c", "c1")):
        gate.release(child, client)
    assert gate.in_flight("a") == 0 and not gate._children and not gate._clients
    gate.acquire("d", "c1")  # free again


def test_every_way_a_call_ends_gives_its_slot_back():
    go = threading.Event()
    gate = GuestIO(threads=4, per_child=1, per_client=10)
    with TestClient(app_with(gate, go)) as c:
        assert c.get("/call/x").json() == {"v": 42}
        assert c.get("/missing/x").status_code == 404  # an error before the first byte
        assert gate.in_flight("x") == 0
        go.set()
        with c.stream("GET", "/stream/x", params={"n": 1000}) as r:  # left after one line
            assert next(r.iter_lines()) == "0"
        assert c.get("/stream/x").text == "0\n1\n2\n"  # the slot came back: this one is let in
        assert gate.in_flight("x") == 0
