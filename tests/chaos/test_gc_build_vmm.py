"""Found by the crash harness (seed 7, rounds 1 and 3): kill -9 of the daemon during a live branch or a layer build
left the build's QEMU (the branch's helper VMM, the layer's VMM) running for good, re-parented to init, holding its
scratch RAM: it has no child record and no cgroup, so neither start-up recovery nor `forkd gc` could find it.
gc now kills a QEMU holding a file open in a work directory of this home's tmp/ whose owner pid is dead, and
leaves one whose owner is alive."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.base.settings import settings
from forkd.core.runtime import Runtime


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _build_vmm(work: Path) -> subprocess.Popen:
    """A real QEMU process shaped like a build's VMM: its QMP socket and its log (held open) in the build's work
    directory, as the driver starts one."""
    work.mkdir(parents=True, mode=0o700, exist_ok=True)
    with open(work / "qemu.log", "ab") as log:
        p = subprocess.Popen([settings().qemu, "-M", "none", "-S", "-display", "none", "-nodefaults",
                              "-no-user-config", "-qmp", f"unix:{work}/qmp.sock,server=on,wait=off"],
                             stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (work / "qmp.sock").exists():
        assert p.poll() is None and time.monotonic() < deadline, "QEMU did not start"
        time.sleep(0.05)
    return p


@pytest.fixture
def private_home():
    d = Path(tempfile.mkdtemp(prefix="fkg", dir="/tmp"))
    (d / "tmp").mkdir(mode=0o700)
    yield d
    if (shm := Layout(d).shm_dir) is not None:  # first: a tmpfs directory whose home is gone is another's leftover
        shutil.rmtree(shm, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


def test_gc_kills_the_vmm_of_a_dead_builder_and_spares_a_live_ones(private_home, monkeypatch):
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    orphan = _build_vmm(layout.tmp / f"l-{_dead_pid()}-0123abcd")
    alive = _build_vmm(layout.tmp / f"b-{os.getpid()}-4567cdef")
    try:
        shutil.rmtree(layout.tmp / orphan.args[-1].split("/")[-2])  # start-up recovery empties tmp/ first
        dry = Runtime(layout).gc(dry_run=True, grace=0.0)
        assert orphan.pid in dry["processes"] and alive.pid not in dry["processes"]
        assert orphan.poll() is None  # a dry run kills nothing
        rep = Runtime(layout).gc(grace=0.0)
        assert orphan.pid in rep["processes"]
        assert orphan.wait(10) is not None
        assert alive.poll() is None and alive.pid not in rep["processes"]
    finally:
        for p in (orphan, alive):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_gc_removes_flat_images_no_snapshot_records(private_home, monkeypatch):
    """Found by the crash harness (seed 7, round 28): kill -9 of the daemon while a layer / live branch was between
    keeping its flat image and committing left a 256 MiB flat image on tmpfs that no snapshot records (the
    snapshot became failed); nothing ever removed it. gc removes such an image once it is older than the grace;
    an image a snapshot records stays."""
    import json

    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    flat = layout.make_flat_cache()
    try:
        owned, unowned, young = "a" * 64, "b" * 64, "c" * 64
        snap = layout.snapshots / "kept"
        snap.mkdir(parents=True)
        (snap / "snapshot.json").write_text(json.dumps({"tag": "kept", "status": "ready", "memory_sha256": owned}))
        failed = layout.snapshots / "failed-one"
        failed.mkdir()
        (failed / "snapshot.json").write_text(json.dumps({"tag": "failed-one", "status": "failed",
                                                          "memory_sha256": unowned}))
        for name in (owned, unowned, young):
            (flat / f"{name}.mem").write_bytes(b"\0" * 4096)
        old = time.time() - 600
        for name in (owned, unowned):
            os.utime(flat / f"{name}.mem", (old, old))
        rep = Runtime(layout).gc(grace=60.0)
        assert rep["memory_files"] == [str(flat / f"{unowned}.mem")]
        assert (flat / f"{owned}.mem").exists() and (flat / f"{young}.mem").exists()
        assert not (flat / f"{unowned}.mem").exists()
    finally:
        shutil.rmtree(flat.parent, ignore_errors=True)
