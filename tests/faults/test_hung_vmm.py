"""A VMM that stops answering: a child's QEMU stopped with SIGSTOP (its sockets stay open, nothing answers).

The promise (docs/faults.md): every call on it fails within its timeout with an error (Timeout, exit 5) naming the
child and saying its VMM is stopped; other children answer as before; `ls` reports it; `kill` removes it. The
daemon's start-up recovery with such a child is tests/chaos/test_recover_stuck_child.py."""

from __future__ import annotations

import os
import signal

import pytest

from forkd.base.errors import Timeout
from forkd.client.wire import child_view
from tests.conftest import forkd_cli

pytestmark = [pytest.mark.vm, pytest.mark.faults]


def test_a_stopped_vmm_times_out_naming_the_child_and_harms_no_one_else(rt, fork):
    hung, other = fork(2)
    os.kill(hung.pid, signal.SIGSTOP)  # left stopped: `kill` must end it as it is
    for call in (lambda: rt.ping(hung.id), lambda: rt.exec(hung.id, ["true"]),
                 lambda: rt.eval(hung.id, "1 + 1")):
        with pytest.raises(Timeout) as err:
            call()
        assert f"child {hung.id}" in err.value.message and "stopped" in err.value.message, err.value.message
        assert f"forkd kill {hung.id}" in (err.value.hint or "")
    assert rt.ping(other.id)["child_id"] == other.id
    assert rt.exec(other.id, ["echo", "ok"])["stdout"].strip() == "ok"
    view = {c["id"]: c for c in map(child_view, rt.children())}
    assert view[hung.id]["vmm_stopped"] is True and view[other.id]["vmm_stopped"] is False
    ls = forkd_cli("ls", check=True).stdout
    assert next(line for line in ls.splitlines() if line.startswith(hung.id)).split()[1:4] == \
        ["running", "(VMM", "stopped)"], ls
    assert rt.kill([hung.id]) == [(hung.id, True)]  # SIGKILL ends a stopped process too
    assert hung.id not in {c.id for c in rt.children()}
    assert rt.ping(other.id)["child_id"] == other.id


def test_a_vmm_stopped_mid_call_times_out_naming_the_child(rt, fork):
    """Stopped after the call began (the check before it saw a running VMM): the call's own timeout ends it, and
    the error still names the child."""
    (child,) = fork(1)
    try:
        with pytest.raises(Timeout) as err, rt.agent(child.id) as agent:
            os.kill(child.pid, signal.SIGSTOP)
            agent.ping(timeout=2.0)
        assert f"child {child.id}" in err.value.message and "stopped" in err.value.message, err.value.message
    finally:
        os.kill(child.pid, signal.SIGCONT)
    assert rt.ping(child.id)["child_id"] == child.id
