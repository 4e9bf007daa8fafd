"""A child whose guest broke the agent protocol is quarantined: recorded `failed` before its VMM is stopped, so no
reader in between sees a running child whose VMM is gone (`dead`). On the fake driver (forkd/vmm/fake.py): what is
checked is the supervisor's order, not a guest."""

from __future__ import annotations

from forkd.base import procs
from forkd.base.errors import ProtocolViolation
from forkd.core.requests import Spawn
from forkd.sandbox import supervisor as supervisor_module
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module's runtime


def test_a_quarantined_child_reads_failed_while_its_vmm_is_stopped(rt, base, monkeypatch):
    (child,) = rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    seen = []

    def kill_and_wait(pid, started, *a, **kw):
        seen.append(rt.child(child.id).status)  # what any reader sees while the VMM is being stopped
        return procs.kill_and_wait(pid, started, *a, **kw)

    monkeypatch.setattr(supervisor_module, "kill_and_wait", kill_and_wait)
    rt.supervisor.quarantine(rt.registry.get(child.id), ProtocolViolation("a frame of 4 GiB announced"))
    assert seen == ["failed"]
    rec = rt.child(child.id)
    assert rec.status == "failed" and "misbehaved" in rec.error and rec.pid is None, rec
    assert procs.start_time(child.pid) != child.started  # its VMM is gone
    rt.kill([child.id])
