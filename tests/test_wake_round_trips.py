"""Waking a sleeping child costs few round trips (forkd.sandbox.child.ChildHandle.request): QMP's greeting and the
capabilities answer come in one, the run state and migration status in one (forkd.vmm.capture.ensure_running), and
the guest's clock goes out with the request instead of in a round trip of its own, which holds because the agent
serves `clock` inline, before it reads the next request (forkd.guest.agent.THREADED). No VM: the QMP peer here is
a socket of this test that answers only once everything one round trip should carry has arrived, so a client
that waits in between times out."""

from __future__ import annotations

import ast
import json
import socket
import threading
from pathlib import Path

import pytest

from forkd.image.build import GUEST_DIR
from forkd.vmm import capture
from forkd.vmm.qmp import QMPClient


class Peer:
    """A QMP server on `path` that holds each answer back until `groups[i]` (commands) all arrived: one round
    trip per group. It answers query-status with `state` and query-migrate with `migration`."""

    def __init__(self, path: Path, groups: list[list[str]], state: str = "paused", migration: str = "completed"):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.groups, self.state, self.migration = groups, state, migration
        self.got: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _answer(self, command: str) -> dict:
        if command == "query-status":
            return {"return": {"status": self.state, "running": self.state == "running"}}
        if command == "query-migrate":
            return {"return": {"status": self.migration}}
        return {"return": {}}

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, conn.makefile("rwb") as f:
            for i, group in enumerate(self.groups):
                seen = []
                while len(seen) < len(group):
                    line = f.readline()
                    if not line:
                        return
                    seen.append(json.loads(line)["execute"])
                self.got += seen
                if i == 0:
                    f.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
                for command in seen:
                    f.write(json.dumps(self._answer(command)).encode() + b"\n")
                f.flush()

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def qmp_path(tmp_path):
    return tmp_path / "qmp.sock"


def test_connecting_to_qmp_sends_the_capabilities_before_the_greeting_is_read(qmp_path):
    """The greeting is withheld until qmp_capabilities came: a client that waits for it first times out."""
    peer = Peer(qmp_path, [["qmp_capabilities"]])
    try:
        QMPClient(qmp_path, timeout=3).close()
        assert peer.got == ["qmp_capabilities"]
    finally:
        peer.close()


@pytest.mark.parametrize("state,resumed,commands", [
    ("paused", True, ["query-status", "query-migrate", "cont"]),
    ("running", False, ["query-status", "query-migrate"]),
])
def test_resuming_asks_run_state_and_migration_in_one_round_trip(qmp_path, state, resumed, commands):
    """query-status is answered only once query-migrate came too; `cont` only for a VM that was not running."""
    groups = [["qmp_capabilities"], ["query-status", "query-migrate"]] + ([["cont"]] if resumed else [])
    peer = Peer(qmp_path, groups, state=state)
    try:
        qmp = QMPClient(qmp_path, timeout=3)
        try:
            assert capture.ensure_running(qmp) is resumed
        finally:
            qmp.close()
        peer.thread.join(3)
        assert peer.got == ["qmp_capabilities", *commands]
    finally:
        peer.close()


def test_a_capture_in_flight_is_still_refused_a_resume_it_cannot_take(qmp_path):
    """A state nothing resumes from is an error, not a `cont` (asked in the same round trip as before)."""
    peer = Peer(qmp_path, [["qmp_capabilities"], ["query-status", "query-migrate"]], state="shutdown")
    try:
        qmp = QMPClient(qmp_path, timeout=3)
        try:
            with pytest.raises(capture.ForkdError, match="cannot be resumed"):
                capture.ensure_running(qmp)
        finally:
            qmp.close()
    finally:
        peer.close()


def _agent_constant(name: str):
    """A top-level constant of the guest agent (read from its source: it imports flatly, as in the guest)."""
    tree = ast.parse((GUEST_DIR / "agent.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value
    raise AssertionError(f"agent.py has no {name}")


def test_the_agent_serves_the_clock_inline_so_the_next_request_sees_it():
    """The host sends `clock` and the request without waiting in between: that is right only while the agent
    serves `clock` on its read loop (not on a thread of its own), as the payload forkd sends it."""
    payload = json.dumps({"id": 1, "op": "clock", "args": {"time": 1.0}}).encode()
    ops = _agent_constant("OPS")
    assert "clock" in [k.value for k in ops.keys]
    threaded = ast.literal_eval(_agent_constant("THREADED"))
    assert threaded and not any(t in payload for t in threaded)
