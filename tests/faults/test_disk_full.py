"""$FORKD_HOME on a small filesystem that fills up (a loop-mounted ext4 the test makes and fills for real).

The promise (docs/faults.md): the operation fails with an error naming the cause, nothing half-written is left
`ready` or behind in tmp/, the audit log still verifies (INCOMPLETE, naming the count of lost entries, until the
next append records them), and the same operation works once space is freed.
Needs root (mount). The VM tests restore children of the session's base snapshot, unpacked into the small home."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.errors import ForkdError
from forkd.base.owners import dead_under, owned_under
from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.core.audit import LOST, AuditError, AuditLog, verify
from forkd.core.pack import unpack
from forkd.core.requests import Branch, LayerBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.sandbox.child import ChildRecord
from forkd.service import Service
from forkd.store.snapshot import Snapshot
from tests.chaos.invariants import check_snapshots
from tests.conftest import BASE_TAG, qemu_pids
from tests.faults.mounts import MIB, fill, free_bytes, loop_ext4

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a loop filesystem needs root")]


def _with_base(small: Runtime, pack_file) -> None:
    """The base in the small home (the unpack test leaves it there; unpacked here when that test did not run)."""
    if not any(isinstance(s, Snapshot) and s.tag == BASE_TAG and s.status == "ready" for s in small.store.list()):
        unpack(small, pack_file)


def _nothing_half_written(rt: Runtime) -> None:
    assert check_snapshots(rt) == []  # every snapshot ready and verifying, or failed; none writing
    assert [p for p, _ in owned_under(rt.layout.tmp)] == []  # the failed operation's work is gone with it
    assert dead_under(rt.layout.home) == []


def test_an_audit_append_on_a_full_disk_fails_whole_and_the_log_verifies():
    with loop_ext4(8) as home:
        log = AuditLog(home)
        log.append("test", "first", "t", "ok", 1.0)
        filler = fill(home)
        with pytest.raises(AuditError) as err:  # the log's last block has room for a few lines, then none
            for i in range(2000):
                log.append("test", "filling", f"t{i}", "ok", 1.0, message="x" * 200)
        # ENOSPC before a byte was written, or a write cut short (then undone): which one is up to ext4
        assert ("No space left" in err.value.message or "short write" in err.value.message) and \
            str(log.path) in err.value.message, err.value.message
        assert "free space" in (err.value.hint or "")
        written = verify(home)  # the chain intact, no torn line (a short write was cut back off), the loss counted
        assert not written.torn and written.bad_line is None and written.pending_lost == 1, written
        assert str(written).startswith("INCOMPLETE"), written
        filler.unlink()
        log.append("test", "after", "t", "ok", 1.0)
        after = verify(home)
        assert after.ok and after.lines == written.lines + 2 and after.lost == 1, after
        assert LOST in log.path.read_text().splitlines()[-2]


def test_a_wake_that_cannot_be_recorded_on_a_full_disk_does_not_fail_the_request():
    """A request to a child the idle loop put to sleep resumes it, then records it awake: on a full home that
    record cannot be written, and the request must go on (the soak found every exec on such a child failing with
    ENOSPC while the home was full). The record stays whole, still saying asleep, and is written once space is
    freed. The child's "VMM" is a plain `sleep` process: no step here reaches it."""
    with loop_ext4(8) as mnt:
        rt = Runtime(Layout(mnt / "home"))
        proc = subprocess.Popen(["sleep", "300"])
        try:
            cid, me = rt.registry.new_id(), os.getpid()
            rec = rt.registry.save(ChildRecord(
                id=cid, snapshot="s", created_at=time.time(), dir=str(rt.registry.path(cid)), memory_mib=256,
                vcpus=1, accel="tcg", pid=proc.pid, started=start_time(proc.pid), state="running",
                spawner_pid=me, spawner_started=start_time(me), residency="asleep"))
            filler = fill(mnt)
            rt.handles.of(rec)._woke()  # raised OSError (ENOSPC) before the fix
            assert (rt.child(cid).residency, rt.child(cid).wakes) == ("asleep", 0)
            assert dead_under(rt.layout.home) == [] and [p for p, _ in owned_under(rt.layout.home)] == []
            filler.unlink()
            rt.handles.of(rec)._woke()
            assert (rt.child(cid).residency, rt.child(cid).wakes) == ("awake", 1)
        finally:
            proc.kill()
            proc.wait()


def test_a_request_that_finds_the_home_full_is_unavailable_naming_the_file_not_an_internal_error():
    """A write of the daemon that meets ENOSPC, here storing a declarative object, answers 503 Unavailable (exit 6
    in the CLI) naming the file and how to make room; before, a 500 InternalError."""
    with loop_ext4(8) as mnt:
        home = mnt / "home"
        api = TestClient(create_app(Service.on(Layout(home))), raise_server_exceptions=False)
        pool = {"kind": "ForkPool", "metadata": {"name": "full"}, "spec": {"from": "p", "warm": 1}}
        filler = fill(mnt)
        r = api.post("/v1/pools", json=pool)
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["title"] == "Unavailable" and "No space left on device" in body["detail"], body
        assert str(home) in body["detail"] and "free space" in body["hint"], body
        assert dead_under(home) == [] and [p for p, _ in owned_under(home)] == []
        filler.unlink()
        assert api.post("/v1/pools", json=pool).status_code < 300


@pytest.fixture(scope="module")
def full_home(base_pack):
    """A runtime whose $FORKD_HOME is a 1280 MiB ext4 (a live branch of the base streams its RAM there),
    and a pack of the session's base."""
    out = base_pack
    with loop_ext4(1280) as mnt:
        home = mnt / "home"
        home.mkdir(mode=0o700)
        small = Runtime(Layout(home))
        try:
            yield small, out
        finally:
            small.kill(all_=True)
            for pid in qemu_pids(home):
                os.kill(pid, 9)
            shutil.rmtree(small.layout.flat_cache.parent, ignore_errors=True)


@pytest.mark.vm
@pytest.mark.faults("long")
def test_a_pack_unpack_on_a_full_disk_fails_cleanly_then_works(full_home):
    small, pack_file = full_home
    filler = fill(small.layout.home, leave=32 * MIB)  # the pack holds a few hundred MiB
    try:
        with pytest.raises((ForkdError, OSError)) as err:
            unpack(small, pack_file)
        assert "No space left" in str(err.value), err.value
        assert [s.tag for s in small.store.list()] == []  # nothing installed, not even failed
        _nothing_half_written(small)
    finally:
        filler.unlink()
    done = unpack(small, pack_file)
    assert BASE_TAG in done["installed"]
    _nothing_half_written(small)
    assert small.store.get_ready(BASE_TAG).status == "ready"


@pytest.mark.vm
@pytest.mark.faults("long")
def test_a_layer_build_on_a_full_disk_fails_cleanly_then_works(full_home):
    small, pack_file = full_home
    _with_base(small, pack_file)
    req = LayerBuild(tag="full-layer", parent_tag=BASE_TAG, run=("dd if=/dev/urandom of=/root/r bs=1M count=8",))
    filler = fill(small.layout.home)
    try:
        with pytest.raises((ForkdError, OSError)) as err:
            small.snapshot_diff(req)
        assert "No space left" in str(err.value) or "space" in str(err.value), err.value
        snap = next((s for s in small.store.list() if isinstance(s, Snapshot) and s.tag == "full-layer"), None)
        assert snap is None or snap.status == "failed", snap
        _nothing_half_written(small)
        assert qemu_pids(small.layout.home) == []  # the build's VMM went with it
    finally:
        filler.unlink()
    assert small.snapshot_diff(req).status == "ready"
    _nothing_half_written(small)


@pytest.mark.vm
@pytest.mark.faults("long")
def test_a_live_branch_on_a_full_disk_fails_cleanly_and_its_source_lives_on(full_home):
    small, pack_file = full_home
    _with_base(small, pack_file)
    child = small.fork(Spawn(tag=BASE_TAG))[0]
    small.exec(child.id, ["sh", "-c", "dd if=/dev/urandom of=/root/r bs=1M count=16"])
    filler = fill(small.layout.home)
    try:
        with pytest.raises((ForkdError, OSError)) as err:
            small.branch(Branch(child_id=child.id, tag="full-branch"))
        assert "space" in str(err.value), err.value
        snap = next((s for s in small.store.list() if isinstance(s, Snapshot) and s.tag == "full-branch"), None)
        assert snap is None or snap.status == "failed", snap
        _nothing_half_written(small)
        assert small.ping(child.id)["child_id"] == child.id  # the source runs on, unpaused
    finally:
        filler.unlink()
    assert free_bytes(small.layout.home) > 64 * MIB
    assert small.branch(Branch(child_id=child.id, tag="full-branch")).snapshot.status == "ready"
    _nothing_half_written(small)
    small.kill([child.id])
