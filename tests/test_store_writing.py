"""SnapshotStore.writing: the one way a snapshot comes into being. It commits when the block ends sealed and marks
the snapshot failed, re-raising the original exception, when anything in the block raised -- including a real
layer build (real QEMU) whose files are all written when a later step fails."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from forkd.base.errors import ForkdError
from forkd.base.paths import Layout
from forkd.core.pipeline.layer import LayerJob
from forkd.core.requests import LayerBuild
from forkd.store.snapshot import Snapshot
from forkd.store.store import DATA_FILES, SnapshotStore
from tests.conftest import BASE_TAG, qemu_pids


class Interrupted(Exception):
    """Not a ForkdError: it must come out of the writer as itself, not wrapped or replaced."""


def _record(tag: str) -> Snapshot:
    return Snapshot(tag=tag, status="writing", created_at=time.time(), memory_mib=128, vcpus=1, accel="tcg",
                    image_id="img", kernel_sha256="k", qemu_version="q")


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(Layout(tmp_path / "home"))
    yield s
    if s.layout.flat_cache.parent.name.startswith("forkd-"):  # the tmpfs flat cache of this throw-away store
        shutil.rmtree(s.layout.flat_cache.parent, ignore_errors=True)


def _scratch(store: SnapshotStore, data: bytes) -> Path:
    p = store.layout.tmp / f"forkd-test-{os.getpid()}-{os.urandom(3).hex()}.mem"
    p.write_bytes(data)
    return p


def test_sealed_block_commits_ready_read_only_files_with_their_hashes(store):
    memory = os.urandom(4096) + bytes(1 << 20)  # a tail of zeros stays a hole, but is hashed
    timings = {"boot": 1.5}
    with store.writing(_record("ok"), timings) as w:
        assert store.get("ok").status == "writing"
        w.vmstate.write_bytes(b"device state")
        snap = w.seal(memory=_scratch(store, memory), vmstate=w.vmstate)
        assert snap.status == "writing"  # ready only once the block ends
        timings["after_seal"] = 2.0  # steps after seal still reach the manifest
    got = store.get("ok")
    assert got == w.snap and got.status == "ready" and got.error is None and got.writer_pid is None
    assert got.memory_sha256 == hashlib.sha256(memory).hexdigest()
    assert got.vmstate_sha256 == hashlib.sha256(b"device state").hexdigest()
    assert got.memory_bytes == len(memory) and got.vmstate_bytes == len(b"device state")
    assert got.timings_ms == {"boot": 1.5, "after_seal": 2.0}
    for p in (w.memory, w.vmstate, store.dir("ok") / "snapshot.json"):
        assert p.stat().st_mode & 0o777 == 0o400, p  # read-only, forkd's user only
    assert store.flat_path(got).read_bytes() == memory  # the scratch image became the cached flat image


def test_exception_marks_failed_drops_files_and_propagates_unchanged(store):
    boom = Interrupted("the host went away\nsecond line")
    with pytest.raises(Interrupted) as ei:
        with store.writing(_record("bad")) as w:
            w.vmstate.write_bytes(b"device state")
            w.seal(memory=_scratch(store, os.urandom(8192)), vmstate=w.vmstate)  # every file written
            raise boom
    assert ei.value is boom
    got = store.get("bad")
    assert got.status == "failed" and got.error == "the host went away" and got.writer_pid is None
    assert got.memory_sha256 is None  # the record is the begun one, not what the seal computed
    assert not [f for f in DATA_FILES if (store.dir("bad") / f).exists()]
    assert not list(store.layout.flat_cache.glob("*.mem"))  # the image the seal kept went with the snapshot


WRITER_DIES_AFTER_SEAL = """
import os, sys, time
from pathlib import Path
from forkd.base.paths import Layout
from forkd.store.snapshot import Snapshot
from forkd.store.store import SnapshotStore
store = SnapshotStore(Layout(Path(sys.argv[1])))
rec = Snapshot(tag="dies", status="writing", created_at=time.time(), memory_mib=128, vcpus=1, accel="tcg",
               image_id="img", kernel_sha256="k", qemu_version="q")
with store.writing(rec) as w:
    w.vmstate.write_bytes(b"device state")
    scratch = store.layout.tmp / "scratch.mem"
    scratch.write_bytes(bytes.fromhex(sys.argv[2]))
    w.seal(memory=scratch, vmstate=w.vmstate)
    os._exit(9)  # killed between keeping the flat image and committing
"""


def test_recovery_removes_the_flat_image_a_dead_writer_kept(store):
    """A writer killed after its seal kept the scratch image as the cached flat image (RAM on tmpfs) but before
    commit: recovery fails the snapshot and removes that image, which no other snapshot records (the chaos
    harness found it left behind, 256 MiB of tmpfs per build, until gc's grace expired)."""
    import subprocess
    import sys
    data = os.urandom(4096) + bytes(8192)
    store.layout.tmp.mkdir(parents=True, exist_ok=True)
    got = subprocess.run([sys.executable, "-c", WRITER_DIES_AFTER_SEAL, str(store.layout.home), data.hex()],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 9, got.stderr
    flat = store.flat_cache_path(hashlib.sha256(data).hexdigest())
    assert flat.exists() and store.get("dies").status == "writing"  # the dead writer's state, as left
    assert store.recover() == ["dies"]
    assert store.get("dies").status == "failed"
    assert not flat.exists()


def test_failing_a_snapshot_keeps_a_flat_image_another_snapshot_records(store):
    data = os.urandom(4096)
    with store.writing(_record("keeper")) as w:
        w.vmstate.write_bytes(b"s")
        w.seal(memory=_scratch(store, data), vmstate=w.vmstate)
    with pytest.raises(Interrupted):
        with store.writing(_record("twin")) as w:
            w.vmstate.write_bytes(b"s")
            w.seal(memory=_scratch(store, data), vmstate=w.vmstate)  # the same content
            raise Interrupted("late")
    assert store.flat_path(store.get("keeper")).read_bytes() == data


def test_block_ending_without_seal_is_a_failure(store):
    with pytest.raises(ForkdError, match="without sealing"):
        with store.writing(_record("unsealed")) as w:
            w.vmstate.write_bytes(b"x")
    assert store.get("unsealed").status == "failed"


@pytest.mark.vm
def test_layer_build_failing_after_its_files_are_written_fails_the_snapshot(rt, base, home):
    """A real layer build (restore, steps, save, diff and hashes: every file written) with one more step that
    raises: the snapshot is failed with that error, the exception is the step's own, and nothing is left."""
    boom = Interrupted("failed after the files were written")
    seen: dict[str, bool] = {}

    class FailingLayer(LayerJob):
        def steps(self):
            return [*super().steps(), ("after", self.after)]

        def after(self) -> None:
            d = self.rt.store.dir(self.req.tag)
            seen.update({f: (d / f).exists() for f in ("vmstate", "diff.pages", "diff.data")})
            raise boom

    job = FailingLayer(rt, LayerBuild.of(tag="late-fail", parent_tag=BASE_TAG, run=("echo x > /root/x",)))
    with pytest.raises(Interrupted) as ei:
        job.execute()
    assert ei.value is boom
    assert seen == {"vmstate": True, "diff.pages": True, "diff.data": True}
    snap = rt.store.get("late-fail")
    assert snap.status == "failed" and snap.error == "failed after the files were written"
    assert not [f for f in DATA_FILES if (rt.store.dir("late-fail") / f).exists()]
    assert set(job.timings) == {"restore", "steps", "save", "diff", "after"}
    assert not job.files.dir.exists()  # the work dir was unwound
    assert not list(job.memory.parent.glob("forkd-layer-late-fail-*"))  # and the scratch image (adopted or gone)
    assert set(qemu_pids(home)) <= {r.pid for r in rt.children() if r.pid}  # the build's VMM is gone
    rt.rmi("late-fail")


def test_a_flat_image_left_in_a_foreign_cache_is_said_not_silently_kept(store, caplog):
    """A flat cache directory someone else took over (here: made another uid's) is never unlinked through, and the
    image it keeps (RAM on tmpfs) is named in a warning instead of being dropped from view without a word."""
    data = os.urandom(4096)
    with pytest.raises(Interrupted):
        with store.writing(_record("lost")) as w:
            w.vmstate.write_bytes(b"s")
            w.seal(memory=_scratch(store, data), vmstate=w.vmstate)
            os.chown(store.layout.flat_cache, 65534, 65534)
            raise Interrupted("late")
    content = hashlib.sha256(data).hexdigest()
    assert store.flat_cache_path(content).exists()
    assert any(content[:16] in r.getMessage() and "not removed" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
