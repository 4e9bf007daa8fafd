"""Found by the crash harness (seed 23, rounds 8 and 9, a kill -9 during `layer`, `claim`, `fork` and `kill` at
once): a child directory (sockets, logs) with no record. The record was deleted before its directory (the
removal was a plain recursive delete, which a kill -9 can stop after the record went), and start-up recovery left
the directory because it was younger than gc's grace (a record-less directory was taken for a spawn in progress:
a directory was made before its record).

Now a record is born with its directory (renamed into place with the record inside) and leaves with it (renamed
to an owned name before the delete): a killed process leaves only an owned temporary of a dead maker, and a
record-less directory is never a spawn's, so recovery removes it whatever its age. Each crash state below is
made exactly (a process killed at the point named), then the daemon's own start-up recovery runs. No VM: the
directory's files stand for a VMM's (a unix socket bound there, a log)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.core.runtime import Runtime
from forkd.sandbox.registry import RECORD, ChildRecord, Registry
from forkd.service.service import Service
from tests.chaos.invariants import check_orphans
from tests.chaos.test_gc_build_vmm import private_home  # noqa: F401 - a fixture

KILLED_AT = """
import os, signal, sys, time
from pathlib import Path
import forkd.sandbox.registry as registry
from forkd.base.paths import Layout
from forkd.sandbox.registry import ChildRecord, Registry

where, cid = sys.argv[1], sys.argv[2]
reg = Registry(Layout(Path(os.environ["FORKD_HOME"])))
if where == "remove":  # kill -9 right after the record is deleted, the rest of the directory still there
    real = os.unlink
    def unlink(path, *a, **kw):
        real(path, *a, **kw)
        if os.fspath(path) == registry.RECORD:
            os.kill(os.getpid(), signal.SIGKILL)
    os.unlink = unlink
    reg.remove(cid)
else:  # "create": kill -9 before the first record of a new child is written
    def write_json(*a, **kw):
        os.kill(os.getpid(), signal.SIGKILL)
    registry.write_json = write_json
    reg.save(ChildRecord(id=cid, snapshot="s", created_at=time.time(), dir=str(reg.path(cid)), memory_mib=256,
                         vcpus=1, accel="tcg"))
sys.exit(3)  # not reached: the process is killed at the point named
"""


def _vmm_files(d: Path) -> socket.socket:
    """What a child's VMM leaves in its directory: its sockets (really bound) and its log."""
    d.mkdir(mode=0o700, exist_ok=True)
    (d / "vmm.log").write_text("qemu: terminating on signal 9\n")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(d / "qmp.sock"))
    return s


def _child(reg: Registry, cid: str, state: str = "running") -> ChildRecord:
    pid = os.getpid()  # a live process stands for the VMM (recovery adopts it, never kills it: it is no QEMU)
    return reg.save(ChildRecord(id=cid, snapshot="s", created_at=time.time(), dir=str(reg.path(cid)),
                                memory_mib=256, vcpus=1, accel="tcg", pid=pid, started=start_time(pid),
                                state=state))


def _killed_at(home: Path, where: str, cid: str) -> None:
    env = dict(os.environ, FORKD_HOME=str(home), FORKD_NO_DAEMON="1")
    p = subprocess.run([sys.executable, "-c", KILLED_AT, where, cid], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == -9, f"the process was not killed where planned: {p.returncode} {p.stderr[-2000:]}"


def _left(layout: Layout) -> list[str]:
    return sorted(p.name for p in layout.children.iterdir() if p.name not in (".lock", ".claims.log"))


def test_recovery_removes_a_recordless_child_directory_and_spares_live_ones(private_home, monkeypatch):  # noqa: F811
    """The harness's state exactly: `children/<id>` with sockets and a log, no record, made just now (younger
    than any grace). Beside it a live child and a spawn in progress (a live process's half-made directory)."""
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    reg = Registry(layout)
    orphan = _vmm_files(reg.path("c00000000a1"))
    live = _child(reg, "c00000000b2")
    held = _vmm_files(reg.path(live.id))
    spawning = layout.children / owned_name(".c00000000c3.new")  # this test's own: its maker is alive
    spawning.mkdir(mode=0o700)
    try:
        Service.on(layout).recover()  # what `forkd serve` runs at start-up (gc with its default grace)
        assert not reg.path("c00000000a1").exists(), "recovery left a child directory that has no record"
        assert (reg.path(live.id) / RECORD).is_file() and (reg.path(live.id) / "qmp.sock").exists()
        assert spawning.is_dir(), "recovery removed a live process's directory in the making"
        assert [r.id for r in reg.list()] == [live.id] and reg.get(live.id).status == "running"
        assert check_orphans(Runtime(layout), {live.id}) == [f"temporary {spawning} left in the registry"]
    finally:
        orphan.close()
        held.close()


def test_a_remover_killed_after_the_record_went_leaves_no_recordless_directory(private_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    reg = Registry(layout)
    _child(reg, "c00000000d4", state="stopping")
    _vmm_files(reg.path("c00000000d4")).close()
    (reg.path("c00000000d4") / "agent.sock").write_bytes(b"")
    _killed_at(private_home, "remove", "c00000000d4")
    assert not reg.path("c00000000d4").exists(), "the record was deleted before its directory"
    assert [n for n in _left(layout) if n.startswith(".c00000000d4.rm-")], _left(layout)  # the maker's, dead
    Service.on(layout).recover()
    assert _left(layout) == []
    assert check_orphans(Runtime(layout), set()) == []


def test_a_spawner_killed_before_its_first_record_leaves_no_recordless_directory(private_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    _killed_at(private_home, "create", "c00000000e5")
    assert not Registry(layout).path("c00000000e5").exists(), "a child directory was made before its record"
    Service.on(layout).recover()
    assert _left(layout) == []
    assert check_orphans(Runtime(layout), set()) == []
