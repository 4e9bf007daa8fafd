"""A VMM that takes long to exit after SIGKILL (a loaded host swapping its memory back in) still takes its cgroup
with it when its child is killed: the soak found a killed child's memory and cpu groups left behind for good,
because the group was given two seconds to empty. The slow exit is made for real: the stand-in VMM (a `sleep`
placed in the child's groups) is frozen by the v1 freezer before it is killed, so it cannot exit until thawed,
which happens after the old waits ran out. Needs root and cgroup v1's freezer; no VM."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from forkd.base.procs import kill_and_wait, start_time
from forkd.sandbox import cgroups, supervisor
from forkd.sandbox.registry import ChildRecord
from forkd.sandbox.supervisor import release_isolation

FREEZER = Path("/sys/fs/cgroup/freezer")
KILL_WAIT = 0.5  # seconds release_isolation's kill_and_wait waits here for the VMM to go (5 s by default)
THAW_AFTER = 4.0  # seconds: past that wait and the 2 s the group was given before the fix

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists() or
                                 cgroups.detect() is None, reason="needs root and the cgroup v1 freezer")]


@pytest.fixture
def frozen_group():
    g = FREEZER / f"forkd-test-slow-exit-{os.getpid()}"
    g.mkdir()
    yield g
    (g / "freezer.state").write_text("THAWED")
    cgroups.remove_group([g], timeout=30)


def test_a_killed_vmm_slow_to_exit_still_takes_its_cgroup_with_it(tmp_path, frozen_group, monkeypatch):
    monkeypatch.setattr(supervisor, "kill_and_wait", functools.partial(kill_and_wait, timeout=KILL_WAIT))
    cid = "cslowexit01"
    g = cgroups.create(cid, str(tmp_path), None)
    vmm = subprocess.Popen(["sleep", "300"])
    try:
        g.place(vmm.pid)
        (frozen_group / "cgroup.procs").write_text(str(vmm.pid))
        (frozen_group / "freezer.state").write_text("FROZEN")
        os.kill(vmm.pid, signal.SIGKILL)  # pending: a frozen task exits only once thawed
        rec = ChildRecord(id=cid, snapshot="s", created_at=time.time(), dir=str(tmp_path / cid), memory_mib=256,
                          vcpus=1, accel="tcg", pid=vmm.pid, started=start_time(vmm.pid), state="running",
                          cgroup=list(g.paths))
        thaw = threading.Timer(THAW_AFTER, (frozen_group / "freezer.state").write_text, args=("THAWED",))
        thaw.start()
        release_isolation(rec)
        thaw.join()
        assert [p for p in g.paths if Path(p).exists()] == []
    finally:
        (frozen_group / "freezer.state").write_text("THAWED")
        kill_and_wait(vmm.pid, None)
        vmm.wait()
        g.remove(timeout=30)
        cgroups.prune_empty_homes()
