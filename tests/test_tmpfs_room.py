"""Room on the tmpfs for guest RAM is checked before a build or a flat image needs it (forkd.base.space): an error
naming the snapshot, the sizes and FORKD_SHM, instead of ENOSPC mid-copy or a SIGBUS in a VMM whose guest touched a
page of a full tmpfs. A real tmpfs of 16 MiB, mounted by the test, stands in for a full /dev/shm (needs root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from forkd.base.errors import Unavailable
from forkd.core.requests import ParentBuild
from tests.conftest import BASE_TAG, qemu_pids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "forkd-small", str(d)], check=True)
    monkeypatch.setenv("FORKD_SHM", str(d))
    yield d
    subprocess.run(["umount", "-l", str(d)], check=True)


@pytest.mark.vm
def test_a_parent_build_without_room_fails_before_it_boots(rt, home, small_shm):
    before = set(qemu_pids(home))
    with pytest.raises(Unavailable) as exc:
        rt.create_snapshot(ParentBuild.of(tag="no-room", memory_mib=128))
    assert "the guest memory of no-room (128 MiB) needs 128 MiB" in exc.value.message
    assert str(small_shm) in exc.value.message and "FORKD_SHM" in exc.value.hint
    assert set(qemu_pids(home)) <= before  # no VMM was started for it
    snap = rt.store.get("no-room")  # recorded as failed, with the reason
    assert snap.status == "failed" and "needs 128 MiB" in snap.error
    rt.rmi("no-room", force=True)


@pytest.mark.vm
def test_a_flat_image_without_room_is_refused_with_the_snapshot_named(rt, base, small_shm):
    with pytest.raises(Unavailable) as exc:
        rt.store.materialize(BASE_TAG)
    assert f"the flat image of snapshot {BASE_TAG!r} needs 512 MiB" in exc.value.message
    left = [p for p in small_shm.rglob("*") if p.is_file() and p.name != "home"]  # `home`: the dir's owner marker
    assert left == []  # nothing half-written
