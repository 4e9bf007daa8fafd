"""A snapshot begun on a home whose filesystem is full (a size-limited tmpfs the test mounts and fills for real:
on tmpfs a directory takes no data page, so only the record's write fails, the case the hour soak met once).

The promise: a refused begin leaves nothing under the tag (no directory without its record, which `snapshot ls`
would not show and which refused every later snapshot of that tag), and the same tag can be begun once space is
freed. No VM. Needs root (mount)."""

from __future__ import annotations

import errno
import os
import time

import pytest

from forkd.base.paths import Layout
from forkd.store.snapshot import Snapshot
from forkd.store.store import SnapshotStore
from tests.faults.mounts import fill, small_tmpfs

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]


def _record(tag: str) -> Snapshot:
    return Snapshot(tag=tag, status="writing", created_at=time.time(), memory_mib=128, vcpus=1, accel="tcg",
                    image_id="img", kernel_sha256="k", qemu_version="q")


def test_a_begin_refused_for_space_leaves_nothing_and_the_tag_works_once_freed():
    with small_tmpfs(4) as mnt:
        store = SnapshotStore(Layout(mnt / "home"))
        filler = fill(mnt)
        with pytest.raises(OSError) as caught:
            store.begin(_record("br"))
        assert caught.value.errno == errno.ENOSPC
        assert not store.dir("br").exists(), "a refused begin left a directory under the tag"
        assert list(store.layout.tmp.iterdir()) == [], "a refused begin left its staging directory"
        filler.unlink()
        assert store.begin(_record("br")).status == "writing"
        assert store.get("br").writer_pid == os.getpid()


def test_a_directory_left_without_its_record_is_replaced_by_a_begin_and_removed_by_rm(tmp_path):
    """As an older forkd could leave one."""
    store = SnapshotStore(Layout(tmp_path / "home"))
    store.dir("old").mkdir()
    assert store.begin(_record("old")).status == "writing"
    store.dir("gone").mkdir()
    store.remove("gone")
    assert not store.dir("gone").exists()
