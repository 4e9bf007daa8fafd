"""The agent relay's bounds (forkd.core.relay over forkd.vmm.agent_tcp and the guest's agent_tcp ops), on the fake
driver: its guest is the real agent as a host process in an empty network namespace of its own, so a TCP server the
test starts on that namespace's loopback stands for the guest's (the fake models no network device:
tests/test_ports_relay.py drives real children).
"""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from forkd.base.errors import Conflict, Unavailable
from forkd.core.relay import Relay
from forkd.core.requests import Spawn
from tests.conftest import BASE_TAG
from tests.test_claims_race import wait_for
from tests.test_ports_relay import HOSTILE, LIES


@pytest.fixture(scope="module")
def child(fake_rt, fake_base):
    (rec,) = fake_rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    yield rec
    fake_rt.kill([rec.id])


def _echo_in(rec) -> tuple[int, socket.socket]:
    """A TCP echo server on the loopback of the fake child's namespace (where its agent runs): (its port, its
    listening socket)."""
    from forkd.sandbox import netns

    subprocess.run(["ip", "-n", rec.netns, "link", "set", "lo", "up"], check=True)
    with netns.inside(rec.netns):
        srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], srv


@pytest.fixture
def echo(child):
    port, srv = _echo_in(child)
    yield port, srv
    srv.close()


def _echo(c: socket.socket) -> None:
    try:
        while data := c.recv(1 << 16):
            c.sendall(data)
        c.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    got = bytearray()
    while chunk := sock.recv(1 << 16):
        got += chunk
    return bytes(got)


def test_bytes_cross_the_relay_both_ways_and_a_half_close_is_passed_on(fake_rt, child, echo):
    relay = Relay(fake_rt)
    payload = bytes(range(256)) * 2048  # 512 KiB: many chunks each way
    with relay.open(child.id, echo[0]) as s:
        assert _roundtrip(s, payload) == payload
    with relay.open(child.id, echo[0]) as s:  # a second stream after the first ended
        assert _roundtrip(s, b"again") == b"again"


def test_streams_per_child_are_capped_and_given_back(fake_rt, child, echo):
    relay = Relay(fake_rt, max_streams=2)
    a, b = relay.open(child.id, echo[0]), relay.open(child.id, echo[0])
    with pytest.raises(Conflict, match="at most 2 per sandbox"):
        relay.open(child.id, echo[0])
    a.close()  # the client goes: its stream ends and its slot is given back
    assert relay.settle(child.id, at_most=1)
    with relay.open(child.id, echo[0]) as c:
        assert _roundtrip(c, b"x") == b"x"
    b.close()


def test_a_port_nobody_listens_on_is_unavailable_and_takes_no_slot(fake_rt, child):
    relay = Relay(fake_rt, max_streams=1)
    free = socket.create_server(("127.0.0.1", 0))  # a port free here, and so unused in the child's namespace
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(Unavailable, match=f"nothing answers on port {port}"):
        relay.open(child.id, port)
    assert relay.streams(child.id) == 0


def test_an_idle_stream_is_closed(fake_rt, child, echo):
    relay = Relay(fake_rt, idle=1.0)
    with relay.open(child.id, echo[0]) as s:
        s.settimeout(120)
        assert s.recv(1) == b""  # nothing moved: the relay closed it (the recv returns at its end, no sleep)
    assert relay.settle(child.id)  # and its slot given back


def test_the_guest_caps_its_own_streams(fake_rt, child, echo):
    """The agent refuses a stream past its own cap, whoever asks (a host that forgot its bound)."""
    from forkd.vmm.agent_replies import AgentError

    with fake_rt.agent(child.id) as a:
        cap = a.call("exec_code", {"code": "import agent_tcp; print(agent_tcp.TCP_STREAMS)"})
        n = int(cap["stdout"])
        sids = [a.call("tcp_open", {"port": echo[0]})["stream"] for _ in range(n)]
        with pytest.raises(AgentError, match="relayed TCP streams are open already"):
            a.call("tcp_open", {"port": echo[0]})
        for sid in sids:
            a.call("tcp_close", {"stream": sid})


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_guest_that_lies_on_the_relay_is_stopped(fake_rt, fake_base, lie):
    """The agent's tcp_read replaced by one that lies (run in the agent process, as guest code can): the stream
    ends, the child is stopped as misbehaving, and the relay serves another child."""
    victim, bystander = fake_rt.fork(Spawn.of(tag=BASE_TAG, n=2))
    ports = {}
    try:
        for rec in (victim, bystander):
            ports[rec.id] = _echo_in(rec)
        with fake_rt.agent(victim.id) as a:
            a.exec_code(HOSTILE + f"_ops['tcp_read'] = {LIES[lie]}\n")
        relay = Relay(fake_rt)
        with relay.open(victim.id, ports[victim.id][0]) as s:
            s.settimeout(120)
            try:  # the relay may read from the lying agent before this write: then the stream has already ended
                s.sendall(b"x")
                ended = s.recv(1 << 16) == b""
            except (BrokenPipeError, ConnectionResetError):
                ended = True
            assert ended  # the stream ended with the child
        # the stream may end as the VMM dies, a moment before its record is written `failed`: wait for the record
        rec = wait_for(lambda: (r := fake_rt.child(victim.id)).status == "failed" and r, 60, "a failed record")
        assert "misbehaved" in (rec.error or ""), rec
        assert relay.settle(victim.id)
        with relay.open(bystander.id, ports[bystander.id][0]) as s:
            assert _roundtrip(s, b"still served") == b"still served"
    finally:
        fake_rt.kill([victim.id, bystander.id])
        for _, srv in ports.values():
            srv.close()
