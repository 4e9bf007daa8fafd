"""forkd/vmm/CONTRACT.md, operation by operation, against every driver: QEMU (real microVMs, marked vm) and the fake
driver (host processes; the no-VM tier). Logic above the driver may be tested on the fake only because it passes
these."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from forkd.base.procs import is_alive
from forkd.vmm.agent_client import AgentClient, AgentTimeout
from forkd.vmm.driver import Machine, RunFiles, Vm, VmmDriver
from forkd.vmm.drivers import make_driver

WARM = "CONTRACT_GLOBAL = 'set before the save'"
DRIVERS = [pytest.param("fake", id="fake"), pytest.param("qemu", id="qemu", marks=pytest.mark.vm)]


class Parent:
    """A saved parent: its machine, memory file and device state, made once per driver."""

    def __init__(self, driver: VmmDriver, machine: Machine, dir: Path):
        self.driver, self.machine, self.dir = driver, machine, dir
        self.memory, self.state = dir / "memory", dir / "vmstate"
        self.children: list[Vm] = []

    def restore(self, name: str, **kw) -> Vm:
        vm = self.driver.restore(self.machine, self.memory, self.state, RunFiles(self.dir / name), timeout=60, **kw)
        self.children.append(vm)
        return vm


def _machine(name: str, tmp: Path, request: pytest.FixtureRequest) -> Machine:
    if name == "fake":
        return Machine(kernel=tmp / "no-kernel", initrd=tmp / "no-initrd", memory_mib=32)
    rt = request.getfixturevalue("rt")
    image, _ = rt.build_image()
    decision, _ = rt.accelerator(image)
    return Machine(kernel=image.kernel, initrd=image.initrd, memory_mib=256, accel=decision.accel)


@pytest.fixture(scope="module", params=DRIVERS)
def parent(request):
    name = request.param
    tmp = Path(tempfile.mkdtemp(prefix="fkdc", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    driver = make_driver(tmp / "overlays", name=name)
    p = Parent(driver, _machine(name, tmp, request), tmp)
    vm = driver.boot(p.machine, p.memory, RunFiles(tmp / "parent"), timeout=120)
    assert {"start_vmm", "connect", "agent_ready"} <= set(vm.timings_ms)
    vm.agent.exec_code(WARM)
    vm.agent.exec(["sh", "-c", "echo parent > /root/parent.txt"])
    driver.save(vm, p.state)
    assert not is_alive(vm.pid, vm.started), "save leaves no VMM behind"
    yield p
    for child in p.children:
        driver.stop(child)
    shutil.rmtree(tmp, ignore_errors=True)


def test_children_restore_the_parents_files_and_interpreter_privately(parent):
    a, b = parent.restore("a"), parent.restore("b")
    assert {"start_vmm", "connect", "load_state", "resume"} <= set(a.timings_ms)
    for vm in (a, b):
        assert vm.agent.read_file("/root/parent.txt") == b"parent\n"
        assert vm.agent.eval("CONTRACT_GLOBAL")["value"] == repr("set before the save")
    a.agent.exec(["sh", "-c", "echo a > /root/mine.txt"])
    assert b.agent.exec(["cat", "/root/mine.txt"])["exit_code"] != 0, "a child's writes are its own"
    c = parent.restore("c")
    assert c.agent.exec(["cat", "/root/mine.txt"])["exit_code"] != 0, "a child never writes its parent's memory"


def test_on_start_sees_the_vmm_and_a_failing_one_leaves_no_process(parent):
    seen = []
    vm = parent.restore("started", on_start=seen.append)
    assert seen and seen[0].pid == vm.pid and is_alive(vm.pid, vm.started)

    def refuse(vm: Vm) -> None:
        seen.append(vm)
        raise RuntimeError("placed in no cgroup")

    with pytest.raises(Exception, match="placed in no cgroup"):
        parent.restore("refused", on_start=refuse)
    assert not is_alive(seen[-1].pid, seen[-1].started), "the VMM of a failed restore is stopped"


def test_pause_stops_the_guest_until_ensure_running(parent):
    vm, d = parent.restore("sleeper"), parent.driver
    assert d.run_state(vm) == "running" and d.ensure_running(vm) is False
    d.pause(vm)
    assert d.run_state(vm) == "paused"
    with pytest.raises(AgentTimeout):
        vm.agent.ping(timeout=1.0)
    assert d.ensure_running(vm) is True and d.run_state(vm) == "running"
    vm.agent.ping(timeout=30)


def test_attach_release_and_stop(parent):
    vm, d = parent.restore("attached"), parent.driver
    d.release(vm)  # this process's connections closed (one control channel at a time: callers serialise)
    assert vm.agent is None and is_alive(vm.pid, vm.started), "release leaves the VM running"
    other = d.attach(vm.files, vm.pid, vm.started)
    assert other.agent is None and other.pid == vm.pid  # no I/O
    d.connect(other, timeout=10)
    assert d.run_state(other) == "running"
    d.release(other)
    agent = AgentClient(vm.files.agent, connect_timeout=10)
    try:
        agent.ping(timeout=30)
    finally:
        agent.close()
    d.stop(other)  # a handle attach made stops the VMM it names
    assert not is_alive(vm.pid, vm.started)


def test_a_capture_becomes_a_snapshot_of_its_instant(parent, tmp_path):
    vm, d = parent.restore("source"), parent.driver
    with pytest.raises(OSError):
        d.open_capture(vm, tmp_path / "missing-dir" / "stream", live=True)
    assert d.run_state(vm) == "running", "an unwritable destination pauses nothing"
    live = d.live_capture_problem(vm) is None  # QEMU: not where the host refuses an unprivileged userfaultfd
    vm.agent.exec(["sh", "-c", "echo before > /root/when.txt"])
    d.connect(vm, timeout=10)
    cap = d.open_capture(vm, parent.dir / "stream", live=live)
    try:
        if not live:
            cap.pause()
        cap.start()
        if live:
            cap.wait_stopped(60)
            cap.wait_resumed(60)
            assert cap.resumed_at is not None  # the branch pipeline times the resume from it
        cap.wait_done(300)
    finally:
        cap.close()
    assert d.ensure_running(vm) is not live  # a stopped capture leaves the VM paused for its caller
    vm.agent.exec(["sh", "-c", "echo after > /root/when.txt"])
    branch = Parent(d, parent.machine, parent.dir)
    branch.memory, branch.state = parent.dir / "branch.mem", parent.dir / "branch.vmstate"
    timings = d.stream_to_snapshot(parent.machine, parent.dir / "stream", branch.memory, branch.state,
                                   parent.dir / "convert")
    assert {"convert_start", "convert_load", "convert_save_state"} <= set(timings)
    child = branch.restore("from-branch")
    parent.children.append(child)
    assert child.agent.read_file("/root/when.txt") == b"before\n"
    assert child.agent.eval("CONTRACT_GLOBAL")["value"] == repr("set before the save")

