"""A daemon's start-up recovery beside a layer build another live process runs in-process (the crash harness's
gap build: `forkd snapshot diff` started while no daemon answered, a daemon started beside it) takes nothing of
that build: its `writing` snapshot, its work directory in tmp/, its scratch guest RAM on tmpfs and its VMM stay;
once the builder is killed, the next recovery removes every one of them.

The build is made exactly as LayerJob makes it, up to its VMM running, by a helper process that then waits (a
build mid-way); the VMM is a real QEMU (`-M none`) holding its log in the work directory as the driver's does.
A gap build the harness saw fail with its QEMU alive was not this (docs/faults.md says what it was)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.base.procs import is_alive
from forkd.core.runtime import Runtime
from forkd.service.service import Service
from tests.chaos.test_gc_build_vmm import private_home  # noqa: F401 - a fixture

BUILDER = """
import os, subprocess, sys, time
from pathlib import Path
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import create_private_file, ensure_private_dir, make_private_dir
from forkd.base.settings import settings
from forkd.store.snapshot import Snapshot
from forkd.store.store import SnapshotStore

layout = Layout(Path(os.environ["FORKD_HOME"]))
store = SnapshotStore(layout)
store.begin(Snapshot(tag="ly-1", status="writing", created_at=time.time(), memory_mib=256, vcpus=1, accel="tcg",
                     image_id="default", kernel_sha256="0" * 64, qemu_version="7.2"))
work = make_private_dir(ensure_private_dir(layout.tmp) / owned_name("l", nbytes=4))  # as Job.workdir
scratch = layout.scratch_dir() / owned_name("forkd-layer-ly-1", ".mem", nbytes=16)  # as Job.scratch_memory
os.close(create_private_file(scratch))
with open(work / "qemu.log", "ab") as log:
    vmm = subprocess.Popen([settings().qemu, "-M", "none", "-S", "-display", "none", "-nodefaults",
                            "-no-user-config", "-qmp", f"unix:{work}/qmp.sock,server=on,wait=off"],
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
while not (work / "qmp.sock").exists():
    time.sleep(0.05)
print(work, scratch, vmm.pid, flush=True)
sys.stdin.read()  # a build mid-way: until the test kills this process
"""


@pytest.fixture
def builder(private_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    p = subprocess.Popen([sys.executable, "-c", BUILDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, FORKD_HOME=str(private_home)))
    line = p.stdout.readline().split()
    vmm = int(line[2]) if len(line) == 3 else None
    try:
        assert len(line) == 3, f"the builder did not start: exit {p.wait()}"
        yield p, Path(line[0]), Path(line[1]), vmm
    finally:
        p.kill()
        p.wait()
        if vmm is not None and is_alive(vmm, None):
            os.kill(vmm, 9)


def test_start_up_recovery_takes_nothing_of_a_live_builders_build_and_all_of_a_dead_ones(builder, private_home):  # noqa: F811
    proc, work, scratch, vmm = builder
    layout = Layout(private_home)
    Service.on(layout).recover()  # the daemon's start-up: failed snapshots, then gc (default grace)
    rt = Runtime(layout)
    assert rt.store.get("ly-1").status == "writing"
    assert work.is_dir() and (work / "qemu.log").exists() and scratch.exists()
    assert _running(vmm)
    assert not rt.gc(dry_run=True, grace=0.0)["leftovers"]  # not even with no grace at all

    proc.kill()  # the builder is killed mid-build: everything it left is now a leftover
    proc.wait()
    Service.on(layout).recover()
    assert Runtime(layout).store.get("ly-1").status == "failed"
    assert not work.exists() and not scratch.exists()
    deadline = time.monotonic() + 30  # SIGKILL sent (through a pidfd): the exit itself is the kernel's
    while _running(vmm) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(vmm), f"the dead builder's VMM {vmm} still runs"


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a killed VMM whose parent died waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
