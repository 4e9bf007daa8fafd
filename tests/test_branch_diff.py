"""Diff BRANCH with real QEMU guests (issue 18): a running child as a chain layer over its own snapshot, the
source paused only while its device state and the pages it wrote are taken (forkd.core.pipeline.branch_diff).

Runs in a FORKD_HOME of its own under /dev/shm (tests.branching's fixtures), with the session's image."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from forkd.core.branch import branch
from forkd.core.requests import Branch, Compaction
from forkd.vmm.diff_capture import has_configuration
from tests.branching import SBASE, WRITER, _mark, _seen

pytestmark = pytest.mark.vm


def test_a_diff_branch_is_a_layer_of_the_pages_the_source_wrote(srt, sfork):
    (c,) = sfork(1)
    assert srt.exec_code(c.id, WRITER)["error"] is None  # a thread writing 16 MiB of memory, page after page
    time.sleep(0.5)
    _mark(srt, c.id, "before")
    w0 = int(srt.eval(c.id, "WRITES[0]")["value"])
    res = branch(srt, Branch.of(child_id=c.id, tag="diff1", mode="diff"))
    _mark(srt, c.id, "after")
    snap = res.snapshot
    assert snap.status == "ready", snap.error
    assert snap.parent_tag == SBASE and snap.parent_content_hash == srt.store.get(SBASE).memory_sha256
    assert snap.labels["forkd.dev/branch-mode"] == "diff" and snap.labels["forkd.dev/branch-of"] == c.id
    # only what the child wrote is stored: at least its 16 MiB buffer's pages, far from its 512 MiB of RAM
    assert 4096 <= snap.diff_pages <= res.timings_ms["pages"] < (128 << 20) // 4096, res.timings_ms
    assert res.pause_ms is not None and res.qemu_downtime_ms is not None
    assert not has_configuration(srt.store.vmstate_path("diff1"))  # QEMU's device-state-only save
    d = srt.store.dir("diff1")
    for name in ("diff.pages", "diff.data", "vmstate", "snapshot.json"):
        assert (d / name).stat().st_mode & 0o777 == 0o400, name
    assert not (d / "memory.bin").exists()
    assert not any(p.name.startswith("b-") for p in srt.layout.tmp.iterdir())  # the work dir is gone
    assert int(srt.eval(c.id, "WRITES[0]")["value"]) > w0  # the source runs on
    kids = sfork(2, tag="diff1")
    for k in kids:
        assert _seen(srt, k.id) == ("before", "'before'")
        n0 = int(srt.eval(k.id, "WRITES[0]")["value"])  # the writer, caught mid-flight, runs on in each child
        assert n0 >= w0
        time.sleep(0.2)
        assert int(srt.eval(k.id, "WRITES[0]")["value"]) > n0
    assert _seen(srt, c.id) == ("after", "'after'")


def test_diff_branches_of_diff_branches_then_live_and_compacted(srt, sfork):
    """Depth 2 of diff branches; a live branch of a child restored from a device-state-only save (its stream has
    no configuration section either); a compaction of a diff branch (a base with that device state)."""
    (c,) = sfork(1)
    _mark(srt, c.id, "gen0")
    assert branch(srt, Branch.of(child_id=c.id, tag="dgen1", mode="diff")).snapshot.status == "ready"
    (k1,) = sfork(1, tag="dgen1")
    assert _seen(srt, k1.id) == ("gen0", "'gen0'")
    _mark(srt, k1.id, "gen1")
    res = branch(srt, Branch.of(child_id=k1.id, tag="dgen2", mode="diff"))
    assert res.snapshot.status == "ready" and res.snapshot.parent_tag == "dgen1", res.snapshot.error
    (k2,) = sfork(1, tag="dgen2")
    assert _seen(srt, k2.id) == ("gen1", "'gen1'")
    _mark(srt, k2.id, "gen2")
    live = branch(srt, Branch.of(child_id=k2.id, tag="dgen3-live", mode="live"))
    assert live.snapshot.status == "ready" and live.snapshot.parent_tag is None, live.snapshot.error
    (k3,) = sfork(1, tag="dgen3-live")
    assert _seen(srt, k3.id) == ("gen2", "'gen2'")
    srt.compact(Compaction.of(from_tag="dgen2", to_tag="dgen2-flat"))
    (k4,) = sfork(1, tag="dgen2-flat")
    assert _seen(srt, k4.id) == ("gen1", "'gen1'")


def test_no_wait_diff_branch_returns_once_the_source_runs(srt, sfork):
    (c,) = sfork(1)
    _mark(srt, c.id, "early")
    res = branch(srt, Branch.of(child_id=c.id, tag="diff-nowait", mode="diff", wait=False))
    assert res.snapshot.status == "writing" and res.thread is not None  # sealed in the background
    assert "pause" in res.timings_ms
    _mark(srt, c.id, "later")  # the source answers at once, and the branch keeps the earlier instant
    res.thread.join(300)
    assert srt.store.get("diff-nowait").status == "ready"
    (k,) = sfork(1, tag="diff-nowait")
    assert _seen(srt, k.id) == ("early", "'early'")


def test_the_source_vmm_holds_no_descriptor_of_the_snapshot(srt, sfork):
    """The source's VMM runs the guest's code on after the branch: it must keep no way to rewrite the snapshot
    once sealed. QEMU writes the device state into a memfd of forkd's (its fd set is removed afterwards) and
    forkd copies it into the snapshot's file (SECURITY.md section 7)."""
    (c,) = sfork(1)
    res = branch(srt, Branch.of(child_id=c.id, tag="diff-fds", mode="diff"))
    assert res.snapshot.status == "ready"
    pid = srt.child(c.id).pid
    store = str(srt.store.dir("diff-fds"))
    held = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
    assert not [h for h in held if h.startswith(store) or "forkd-device-state" in h], held


def test_a_stale_fd_set_left_by_a_killed_branch_is_cleared(srt, sfork):
    """A branch killed between handing QEMU its buffer and taking it back leaves the fd set in the VMM. The next
    diff branch clears the set before adding its own buffer (QEMU 7.2 would pick the newest descriptor of a set
    anyway) and removes its own afterwards: the VMM ends up holding neither buffer, and nothing went into the dead
    branch's."""
    from forkd.vmm.diff_capture import FDSET
    from forkd.vmm.driver import RunFiles

    (c,) = sfork(1)
    rec = srt.registry.get(c.id)
    vm = srt.driver.attach(RunFiles(Path(rec.dir)), rec.pid, rec.started)
    stale = os.memfd_create("stale-branch")
    try:
        srt.driver.connect(vm)
        wfd = os.open(f"/proc/self/fd/{stale}", os.O_WRONLY)
        try:
            vm.qmp.execute("add-fd", {"fdset-id": FDSET}, fds=[wfd])
        finally:
            os.close(wfd)
        srt.driver.release(vm)
        _mark(srt, c.id, "fresh")
        res = branch(srt, Branch.of(child_id=c.id, tag="diff-stale", mode="diff"))
        assert res.snapshot.status == "ready", res.snapshot.error
        assert os.fstat(stale).st_size == 0  # nothing went into the dead branch's buffer
        srt.driver.connect(vm)
        assert not [s for s in vm.qmp.execute("query-fdsets") if s["fdset-id"] == FDSET]
        held = [os.readlink(f) for f in Path(f"/proc/{rec.pid}/fd").iterdir()]
        assert not [h for h in held if "stale-branch" in h or "forkd-device-state" in h], held
    finally:
        srt.driver.release(vm)
        os.close(stale)
    (k,) = sfork(1, tag="diff-stale")
    assert _seen(srt, k.id) == ("fresh", "'fresh'")


def test_refused_up_front_while_another_connection_holds_the_agent(srt, sfork):
    """QEMU serves one host connection per agent port; the diff branch must hold it (and send nothing on it while
    the source is paused: virtio-serial would write what arrives into guest RAM after the device state was
    saved). With another connection holding it, the branch is refused before anything is written or paused, and
    the fork verb branches live instead."""
    from forkd.core import forking
    from forkd.core.pipeline.branch_diff import DiffUnavailable
    from forkd.vmm.agent_client import AgentClient

    (c,) = sfork(1)
    holder = AgentClient(Path(c.dir) / "agent.sock")
    try:
        holder.ping()
        with pytest.raises(DiffUnavailable, match="held by another connection"):
            branch(srt, Branch.of(child_id=c.id, tag="diff-held", mode="diff"))
        assert "diff-held" not in {s.tag for s in srt.store.list()}  # nothing written
        res, kids = forking.fork(srt, c.id, 1, tag="fork-held")
        assert res.snapshot.labels["forkd.dev/branch-mode"] == "live" and len(kids) == 1
        assert res.capture == "write-protect" and "agent" in res.capture_note  # not by pages either: held
        assert holder.ping()["child_id"] == c.id  # the source ran on, its agent still ours
    finally:
        holder.close()
    srt.kill([k.id for k in kids])


def test_refused_up_front_past_the_depth_cap(srt, sfork, monkeypatch):
    from forkd.core.pipeline import branch_diff

    (c,) = sfork(1)
    monkeypatch.setattr(branch_diff, "MAX_DEPTH", 0)
    with pytest.raises(branch_diff.DiffUnavailable, match="layers deep") as ei:
        branch(srt, Branch.of(child_id=c.id, tag="diff-deep", mode="diff"))
    assert "snapshot compact" in ei.value.hint
    assert "diff-deep" not in {s.tag for s in srt.store.list()}
    assert srt.ping(c.id)["child_id"] == c.id


def test_a_paged_out_source_is_read_back_before_the_pause(srt, sfork, swap):
    """An idle source paged out to swap (issue 18's page-out) has its pages read back before it is stopped, so the
    pause does not read the pages it wrote from swap; the branch holds its state."""
    from forkd.vmm.pageout import page_out, status_kib

    (c,) = sfork(1)
    assert srt.exec_code(c.id, "KEPT = bytes(range(256)) * 4096")["error"] is None  # 1 MiB the guest wrote
    time.sleep(2.0)
    page_out(c.pid, c.started)
    assert status_kib(c.pid, "VmSwap") >= 4096
    res = branch(srt, Branch.of(child_id=c.id, tag="diff-paged", mode="diff"))
    assert res.snapshot.status == "ready", res.snapshot.error
    assert res.timings_ms["page_in_kib"] >= 4096, res.timings_ms
    (child,) = sfork(1, tag="diff-paged")
    assert srt.eval(child.id, "KEPT == bytes(range(256)) * 4096")["value"] == "True"
