"""Guest -> host through the agent protocol and the console (SECURITY.md section 1). The attacker is code running
in the guest: eval/exec_code run inside the agent process, so that code can write any bytes to the agent's port
(here through the agent's own `port` object, found on the call stack) or to the serial console. Real VMs."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.errors import InvalidInput, ProtocolViolation
from forkd.reconciler.control import Control
from forkd.vmm.agent_client import MAX_FRAME
from forkd.vmm.agent_replies import MAX_FILE, MAX_OUTPUT
from forkd.vmm.driver import RunFiles
from forkd.vmm.qemu import QemuDriver, save_console
from forkd.vmm.qemu_cmdline import CONSOLE_RING

pytestmark = pytest.mark.vm

# run first in the guest: `port` (the agent's virtio port), `rid` (the id of the request being served), `OPS`
GUEST = '''
import json, os, struct, sys
_f = sys._getframe()
while "port" not in _f.f_locals:
    _f = _f.f_back
port, rid, OPS = _f.f_locals["port"], _f.f_locals["rid"], _f.f_globals["OPS"]
def raw(b):
    v = memoryview(b)
    while v:
        v = v[os.write(port.fd, v):]
def frame(payload):
    raw(b"FKD1" + struct.pack(">I", len(payload)) + payload)
'''


def assert_contained(rt, victim, bystander) -> None:
    """The misbehaving child is stopped and recorded as such; the runtime still serves another child."""
    rec = rt.child(victim.id)
    assert rec.status == "failed" and "misbehaved" in (rec.error or ""), rec
    assert not rec.alive
    assert rt.exec_code(bystander.id, "print(6 * 7)")["stdout"] == "42\n"


def attack(rt, fork, code: str, timeout: float = 60.0) -> ProtocolViolation:
    victim, bystander = fork(2)
    with pytest.raises(ProtocolViolation) as exc:
        rt.exec_code(victim.id, GUEST + code, timeout=timeout)
    assert victim.id in str(exc.value)
    assert_contained(rt, victim, bystander)
    return exc.value


def test_frame_header_claiming_4_gib_is_refused_at_once(rt, fork):
    exc = attack(rt, fork, 'raw(b"FKD1" + struct.pack(">I", 0xFFFFFFFF) + os.urandom(1 << 20))', timeout=30)
    assert "4294967295" in str(exc)


def test_frame_over_the_host_cap_is_refused(rt, fork):
    # a well-formed reply of 65 MiB of output, with the right id: refused from its header, never buffered
    code = ('frame(json.dumps({"id": rid, "ok": True, "result": {"value": None, "stdout": "x" * (65 << 20), '
            '"stderr": "", "error": None}}).encode())')
    exc = attack(rt, fork, code, timeout=120)
    assert str(MAX_FRAME) in str(exc)


def test_bytes_past_two_frames_without_an_answer_stop_the_child(rt, fork):
    """No frame header at all, only bytes: the host reads at most two frames' worth (2 x MAX_FRAME) plus a chunk
    without an answer before it stops the child, instead of reading a stream that never ends."""
    code = "chunk = bytes(1 << 20)\nfor _ in range(2 * (MAX_FRAME >> 20) + 16):\n    raw(chunk)"
    exc = attack(rt, fork, f"MAX_FRAME = {MAX_FRAME}\n" + code, timeout=600)
    assert f"sent over {2 * MAX_FRAME} bytes without answering" in str(exc)


def test_reply_that_is_a_json_list(rt, fork):
    attack(rt, fork, 'frame(b"[1, 2, 3]")')


def test_reply_nested_100000_deep(rt, fork):
    attack(rt, fork, 'frame(b"[" * 100000 + b"]" * 100000)')


def test_reply_nested_deep_inside_a_small_skeleton(rt, fork):
    # 5000 deep fits in the skeleton cap: the parser's own depth limit stops it, cleanly
    attack(rt, fork, 'frame(b\'{"id": %d, "ok": true, "result": \' % rid + b"[" * 5000 + b"]" * 5000 + b"}")')


def test_reply_with_many_strings(rt, fork):
    attack(rt, fork, 'frame(json.dumps(["x"] * 100000).encode())')


@pytest.mark.parametrize("reply", [
    '{"id": rid, "ok": True, "result": {"value": None, "stdout": 5, "stderr": [], "error": None}}',
    '{"id": rid, "ok": True, "result": {"value": None, "stdout": "", "stderr": "", "error": "boom"}}',
    '{"id": rid, "ok": True, "result": [1]}',
    '{"id": rid, "ok": "yes", "result": {}}',
    '{"id": rid, "ok": False, "error": "boom"}',
    '{"id": str(rid), "ok": True, "result": {}}',
    '{"id": rid, "ok": True}',
], ids=["field-types", "error-field", "result-list", "ok-not-bool", "error-not-object", "id-string", "no-result"])
def test_reply_with_wrong_shape(rt, fork, reply):
    attack(rt, fork, f"port.write_frame({reply})")


def test_api_answers_a_protocol_violation_with_a_clean_error(rt, fork):
    victim, bystander = fork(2)
    api = TestClient(create_app(Control(rt)))
    r = api.post(f"/v1/sandboxes/{victim.id}/eval", json={"mode": "exec", "code": GUEST + 'frame(b"[]")'})
    assert r.status_code == 502, r.text
    assert r.json()["title"] == "ProtocolViolation" and victim.id in r.json()["detail"]
    r = api.post(f"/v1/sandboxes/{bystander.id}/eval", json={"mode": "eval", "code": "6 * 7"})
    assert r.status_code == 200 and r.json()["result"] == "42"
    assert_contained(rt, victim, bystander)


def test_output_is_capped_on_the_host(rt, fork):
    (child,) = fork(1)
    res = rt.exec_code(child.id, 'print("x" * (3 << 20))')
    assert len(res["stdout"]) <= MAX_OUTPUT and res["truncated"]
    res = rt.exec(child.id, ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' y"])
    assert len(res["stdout"]) <= MAX_OUTPUT and res["truncated"]
    assert rt.child(child.id).status == "running"


def test_read_file_over_the_host_cap_is_refused(rt, fork):
    (child,) = fork(1)
    rt.exec(child.id, ["sh", "-c", f"head -c {MAX_FILE + 4096} /dev/zero > /tmp/big"])
    with pytest.raises(InvalidInput, match="larger than"), rt.agent(child.id) as a:
        a.read_file("/tmp/big")
    assert rt.child(child.id).status == "running"  # an honest guest answered honestly: not its fault
    rt.exec(child.id, ["sh", "-c", "head -c 1000 /dev/zero > /tmp/small"])
    with rt.agent(child.id) as a:
        assert a.read_file("/tmp/small") == b"\0" * 1000


def test_read_file_from_a_lying_agent_is_refused(rt, fork):
    victim, bystander = fork(2)
    # the guest replaces the agent's read_file: it ignores max_bytes and answers with 24 MiB of data
    rt.exec_code(victim.id, GUEST + 'OPS["read_file"] = lambda a: {"path": a["path"], "data": "A" * (32 << 20), '
                                    '"truncated": False}')
    with pytest.raises(ProtocolViolation), rt.agent(victim.id) as a:
        a.read_file("/etc/hostname")
    assert_contained(rt, victim, bystander)


def test_console_flood_stays_under_the_cap(rt, fork):
    """The guest tries to write 200 MiB to its serial console. Under TCG the emulated UART is slow, so each write is
    stopped after 5 s and the guest writes again until it has sent several times the cap (the bound does not depend
    on how much)."""
    (child,) = fork(1)
    sent = 0
    for _ in range(24):  # a loaded host moves fewer bytes in 5 s: go on until well past the cap
        res = rt.exec(child.id, ["sh", "-c", "head -c 209715200 /dev/zero | tr '\\0' x > /dev/ttyS0"], timeout=5)
        assert res["stderr"] == "" and (res["exit_code"] == 0 or res["timed_out"]), res
        serial = rt.exec(child.id, ["cat", "/proc/tty/driver/serial"])["stdout"]
        sent = int(serial.split("tx:", 1)[1].split()[0])
        if sent > 3 * CONSOLE_RING:
            break
    assert sent > 3 * CONSOLE_RING, serial
    d = Path(child.dir)
    sizes = {p.name: p.stat().st_size for p in d.iterdir() if p.is_file()}
    assert all(n <= CONSOLE_RING for n in sizes.values()), sizes
    drv = QemuDriver()
    vm = drv.attach(RunFiles(d), child.pid, child.started)
    try:
        drv.connect(vm, timeout=10)
        text = save_console(vm.qmp, vm.files.console)  # what a failure report shows: the ring's tail
    finally:
        drv.release(vm)
    assert "xxxx" in text
    assert vm.files.console.stat().st_size <= CONSOLE_RING
    assert rt.exec(child.id, ["echo", "still here"])["stdout"] == "still here\n"
