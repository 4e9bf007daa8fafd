"""The tmpfs of flat images full: FORKD_SHM pointed at a size-limited tmpfs the test mounts and fills for real.

The promise (docs/faults.md): a spawn that needs room there (a flat image not made yet) fails with an error naming
the snapshot, the sizes and FORKD_SHM, with nothing half-written; children already running live on (the guest
pages they write are the VMM's private memory); once space is freed the same spawn works. Needs root (mount)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from forkd.base.errors import Unavailable
from forkd.base.paths import Layout
from forkd.core.pack import unpack
from forkd.core.requests import LayerBuild, Spawn
from forkd.core.runtime import Runtime
from tests.conftest import BASE_TAG, qemu_pids
from tests.faults.mounts import MIB, fill, free_bytes, small_tmpfs

pytestmark = [pytest.mark.faults("long"), pytest.mark.vm,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]

GROW = "import os; b = bytearray(os.urandom(1 << 20)) * 192; print(len(b) >> 20)"  # 192 MiB of guest pages written


@pytest.fixture
def shm_home(base_pack, monkeypatch):
    """A home on disk with the base unpacked, its tmpfs directory on a 1200 MiB tmpfs (a layer build's scratch
    RAM and two flat images of the 512 MiB base fit; a third image does not)."""
    with small_tmpfs(1200) as shm:
        monkeypatch.setenv("FORKD_SHM", str(shm))
        home = Path(tempfile.mkdtemp(prefix="fkfault-home-", dir="/tmp"))
        monkeypatch.setenv("FORKD_HOME", str(home))
        rt = Runtime(Layout(home))
        try:
            unpack(rt, base_pack)
            yield rt, shm
        finally:
            rt.kill(all_=True)
            for pid in qemu_pids(home):
                os.kill(pid, 9)
            shutil.rmtree(home, ignore_errors=True)


def test_a_full_tmpfs_fails_new_spawns_with_a_reason_and_running_children_live_on(shm_home):
    rt, shm = shm_home
    layer = rt.snapshot_diff(LayerBuild(tag="shm-layer", parent_tag=BASE_TAG, run=("echo layer > /root/layer.txt",)))
    rt.store.flat_path(layer).unlink()  # the build kept its flat image; a cache: made again when a spawn needs it
    running = rt.fork(Spawn(tag=BASE_TAG))[0]  # the base's flat image is made (and allocated whole) now
    before = {p.name for p in (rt.layout.flat_cache).iterdir()}
    filler = fill(shm)
    try:
        assert free_bytes(shm) < MIB
        with pytest.raises(Unavailable) as err:
            rt.fork(Spawn(tag="shm-layer"))  # its flat image is not made yet: no room for it
        assert "'shm-layer'" in err.value.message and "MiB" in err.value.message, err.value.message
        assert "FORKD_SHM" in (err.value.hint or ""), err.value.hint
        assert {p.name for p in rt.layout.flat_cache.iterdir()} == before  # nothing half-written
        assert [r.id for r in rt.children()] == [running.id]  # no record of the refused spawn is left
        # the running child touches guest pages it never had: they come from its own memory, not the tmpfs
        out = rt.exec_code(running.id, GROW)
        assert out.get("stdout", "").strip() == "192", out
        assert rt.child(running.id).status == "running"
        sibling = rt.fork(Spawn(tag=BASE_TAG))[0]  # an image already made needs no room: spawns go on
        assert rt.ping(sibling.id)["child_id"] == sibling.id
    finally:
        filler.unlink()
    child = rt.fork(Spawn(tag="shm-layer"))[0]
    assert rt.exec(child.id, ["cat", "/root/layer.txt"])["stdout"].strip() == "layer"
    assert rt.ping(running.id)["child_id"] == running.id
