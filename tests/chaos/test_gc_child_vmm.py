"""Found by the crash harness (seed 7, CI of 2026-12-03): kill -9 of a `forkd fork` between QEMU's start and the
record of its pid left that VMM running for good (waiting for its state): the record named no pid, the cgroup
held nothing yet, so start-up recovery reaped the record and left the process. gc now kills a QEMU that names
this home's directory of a child nobody owns, and leaves one whose spawner is alive.

The VMMs here are real QEMU processes shaped like a child's (their QMP socket in the child's directory); they are
never given a guest, since only their command line and process identity are judged."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.base.settings import settings
from forkd.core.runtime import Runtime
from forkd.sandbox.registry import ChildRecord, Registry
from tests.chaos.test_gc_build_vmm import _dead_pid, private_home  # noqa: F401 - a fixture


def _child_vmm(d: Path, user: int | None = None, name: Path | None = None) -> subprocess.Popen:
    """A real QEMU shaped like a child's VMM: it names the child's directory and, when forkd starts it (user
    None), has its log open there; `user` runs it as another uid, which can open nothing there (0700)."""
    d.mkdir(parents=True, mode=0o700, exist_ok=True)
    log = d / "vmm.log" if user is None else Path(os.devnull)
    with open(log, "ab") as out:
        p = subprocess.Popen([settings().qemu, "-M", "none", "-S", "-display", "none", "-nodefaults",
                              "-no-user-config", "-name", f"{name or d}/vm"], stdout=out, stderr=subprocess.STDOUT,
                             user=user)
    deadline = time.monotonic() + 30
    qemu = os.path.realpath(shutil.which(settings().qemu) or settings().qemu)
    while os.path.realpath(f"/proc/{p.pid}/exe") != qemu:  # exec'd: its command line is QEMU's
        assert p.poll() is None and time.monotonic() < deadline, "QEMU did not start"
        time.sleep(0.05)
    return p


def _record(reg: Registry, cid: str, spawner: int) -> None:
    reg.save(ChildRecord(id=cid, snapshot="s", created_at=time.time() - 600, dir=str(reg.path(cid)), memory_mib=512,
                         vcpus=1, accel="tcg", spawner_pid=spawner, spawner_started=start_time(spawner)))


def test_gc_kills_the_vmm_of_a_child_nobody_owns_and_spares_a_spawn_in_progress(private_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    reg = Registry(layout)
    _record(reg, "c00000000a1", _dead_pid())  # its spawner was killed before it recorded the VMM's pid
    _record(reg, "c00000000b2", os.getpid())  # a spawn in progress: its spawner (this test) lives
    unrecorded = _child_vmm(reg.path("c00000000c3"))  # its record is gone already
    orphan, spawning = _child_vmm(reg.path("c00000000a1")), _child_vmm(reg.path("c00000000b2"))
    # a local user's QEMU naming an unrecorded child's directory: its command line is its own to write, but it
    # holds nothing open there (the directory is 0700), so gc, running as root, does not kill it
    stranger = _child_vmm(reg.path("c00000000d4"), user=65534)
    try:
        dry = Runtime(layout).gc(dry_run=True, grace=0.0)
        assert {orphan.pid, unrecorded.pid} <= set(dry["processes"]) and spawning.pid not in dry["processes"]
        assert orphan.poll() is None and unrecorded.poll() is None  # a dry run kills nothing
        rep = Runtime(layout).gc(grace=0.0)
        assert {orphan.pid, unrecorded.pid} <= set(rep["processes"]) and "c00000000a1" in rep["reaped"]
        assert orphan.wait(10) is not None and unrecorded.wait(10) is not None
        assert spawning.poll() is None and spawning.pid not in rep["processes"]
        assert stranger.poll() is None and stranger.pid not in rep["processes"] + dry["processes"]
        assert [r.id for r in reg.list()] == ["c00000000b2"]
    finally:
        for p in (orphan, spawning, unrecorded, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_vmm_naming_a_live_child_in_its_argv_is_judged_by_the_files_it_holds(private_home, monkeypatch):  # noqa: F811
    """A compromised VMM rewrites its command line to name a live child's directory, hoping gc counts it as that
    child's: gc identifies a VMM by the directory it holds a file open in (the kernel's word), so the orphan goes
    and the live child's VMM stays."""
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    reg = Registry(layout)
    _record(reg, "c00000000b2", os.getpid())  # a live spawn: owned
    live = _child_vmm(reg.path("c00000000b2"))
    forger = _child_vmm(reg.path("c00000000e5"), name=reg.path("c00000000b2"))  # no record; argv says b2
    try:
        rep = Runtime(layout).gc(grace=0.0)
        assert forger.pid in rep["processes"] and forger.wait(10) is not None
        assert live.poll() is None and live.pid not in rep["processes"]
    finally:
        for p in (live, forger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_pid_seen_by_the_scan_is_killed_only_if_it_is_still_the_same_process():
    """The identity the scan saw (start time) is checked through a pidfd that then carries the signal: a process
    that is not the one seen (a pid reused between scan and kill) is never hit."""
    from forkd.sandbox.gc import GcReport, _kill_unrecorded

    p = subprocess.Popen(["sleep", "60"])
    try:
        seen = start_time(p.pid)
        report = GcReport()
        _kill_unrecorded(p.pid, seen + 1, report, dry_run=False)  # the scan saw another process under this pid
        assert p.poll() is None and report.processes == []
        _kill_unrecorded(p.pid, seen, report, dry_run=False)
        assert p.wait(10) == -9 and report.processes == [p.pid]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
