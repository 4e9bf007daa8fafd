"""Guest -> host through the process ops (SECURITY.md section 1, issue 16). Code in the guest can replace the
agent's op handlers (eval runs inside the agent: `OPS` is on its call stack), so every proc_* reply may lie:
each is checked (shape, base64, sizes, order, strings per reply) and a lie stops the child, through the
runtime and through the streaming API alike. Real VMs."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.errors import ProtocolViolation
from forkd.reconciler.control import Control
from forkd.vmm.agent_replies import MAX_READ
from tests.security.test_guest_protocol import GUEST, assert_contained

pytestmark = pytest.mark.vm


def lying(rt, victim, op: str, reply: str) -> None:
    """Make the victim's agent answer `op` with `reply` (a Python expression of the args `a`)."""
    rt.exec_code(victim.id, GUEST + f"OPS[{op!r}] = lambda a: {reply}")


@pytest.mark.parametrize("reply", [
    "{'chunks': [[1, 'stdout', '!!not base64!!']], 'done': False, 'exit_code': None}",
    f"{{'chunks': [[i + 1, 'stdout', 'QUFB' * ({MAX_READ} // 6)] for i in range(3)], 'done': False, "
    "'exit_code': None}",  # 1.5 MiB for at most MAX_READ
    "{'chunks': [[5, 'stdout', 'QQ=='], [4, 'stdout', 'QQ==']], 'done': False, 'exit_code': None}",
    "{'chunks': [[1, 'stdin', 'QQ==']], 'done': False, 'exit_code': None}",
    "{'chunks': [[1, 'stdout']], 'done': False, 'exit_code': None}",
    "{'chunks': 'x', 'done': 'yes', 'exit_code': None}",
])
def test_lying_proc_read_stops_the_child(rt, fork, reply):
    victim, bystander = fork(2)
    with rt.agent(victim.id) as a:
        pid = a.start(["sleep", "60"])
    lying(rt, victim, "proc_read", reply)
    with pytest.raises(ProtocolViolation) as exc, rt.agent(victim.id) as a:
        a.read_output(pid, wait=1)
    assert victim.id in str(exc.value)
    assert_contained(rt, victim, bystander)


@pytest.mark.parametrize("op, reply, call", [
    ("proc_list", "{'processes': [[i, True, None, 0.0, False, None, ['x'] * 4] for i in range(2000)]}",
     lambda a: a.processes()),  # over the host's cap on strings per reply
    ("proc_list", "{'processes': [[1, 'yes', None, 0.0, False, None, []]]}", lambda a: a.processes()),
    ("proc_wait", "{'process': [1, True, None, 0.0, False, None, [7]]}", lambda a: a.wait(1, 1)),
    ("proc_start", "{'pid': 'one'}", lambda a: a.start(["true"])),
])
def test_lying_process_replies_stop_the_child(rt, fork, op, reply, call):
    victim, bystander = fork(2)
    lying(rt, victim, op, reply)
    with pytest.raises(ProtocolViolation), rt.agent(victim.id) as a:
        call(a)
    assert_contained(rt, victim, bystander)


def test_a_lying_stream_ends_with_an_error_event_and_the_daemon_serves_on(rt, fork):
    victim, bystander = fork(2)
    lying(rt, victim, "proc_read", "{'chunks': [[1, 'stdout', '%%%']], 'done': False, 'exit_code': None}")
    api = TestClient(create_app(Control(rt)))
    with api.stream("POST", f"/v1/sandboxes/{victim.id}/processes", json={"cmd": "sleep 30"}) as r:
        evs = [json.loads(line) for line in r.iter_lines() if line]
    assert evs[0]["type"] == "start" and evs[-1]["type"] == "error"
    assert evs[-1]["title"] == "ProtocolViolation" and victim.id in evs[-1]["detail"]
    with api.stream("POST", f"/v1/sandboxes/{bystander.id}/processes", json={"cmd": "echo ok"}) as r:
        evs = [json.loads(line) for line in r.iter_lines() if line]
    assert evs[-1]["type"] == "exit" and evs[-1]["exit_code"] == 0
    assert_contained(rt, victim, bystander)
