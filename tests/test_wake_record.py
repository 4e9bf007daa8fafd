"""A wake's record (residency `awake`, one more wake) is written on a thread while the request runs
(forkd.sandbox.child.ChildHandle.request, forkd.sandbox.wake.record), and joined before the request lets go of the
child's wake lock: when the request returns, the record says so, and the idle loop, which needs that lock
exclusively to put the child to sleep, can never see the write land after its own `asleep`. No VM: the child's
"VMM" is a `sleep` process of this test, its memory counts as paging back in (forkd.sandbox.wake.wake stands in:
this process cannot page a `sleep` out), and its agent connection is a stand-in that only closes."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.core.runtime import Runtime
from forkd.sandbox import child as child_mod
from forkd.sandbox import wake
from forkd.sandbox.child import ChildRecord

WAIT_S = 1.0


class Connection:
    """The agent connection, which only closes."""

    def forget(self, rid: int) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def woken(tmp_path, monkeypatch):
    """(runtime, record, what happened in which order, an event set once the request returned) for one running
    child whose next request counts as a wake."""
    rt = Runtime(Layout(tmp_path / "home"))
    proc = subprocess.Popen(["sleep", "300"])
    cid, me = rt.registry.new_id(), os.getpid()
    rec = rt.registry.save(ChildRecord(
        id=cid, snapshot="s", created_at=time.time(), dir=str(rt.registry.path(cid)), memory_mib=256, vcpus=1,
        accel="tcg", pid=proc.pid, started=start_time(proc.pid), state="running", spawner_pid=me,
        spawner_started=start_time(me), residency="paged"))
    order: list[str] = []
    returned = threading.Event()
    update = rt.registry.update

    def slow_update(child_id, change):
        # held back until the request returned: a request that joins the write never does, so after WAIT_S (the
        # one bounded wait here: for something that must not happen) the write goes on and lands first
        returned.wait(WAIT_S)
        out = update(child_id, change)
        order.append("written")
        return out

    monkeypatch.setattr(rt.registry, "update", slow_update)
    monkeypatch.setattr(wake, "wake", lambda pid, started: threading.current_thread())  # "paging back in"
    monkeypatch.setattr(child_mod.AgentClient, "shared", lambda path, connect_timeout=10.0: Connection())
    yield rt, rec, order, returned
    proc.kill()
    proc.wait()


def test_a_request_returns_only_once_its_wake_is_recorded(woken):
    rt, rec, order, returned = woken
    with rt.handles.of(rec).request() as conn:
        assert isinstance(conn, Connection) and not order  # written meanwhile, not before the request's work
    order.append("returned")
    returned.set()
    assert order[0] == "written", "the request returned before its record was written"
    now = rt.child(rec.id)
    assert (now.residency, now.wakes) == ("awake", 1)
