"""BRANCH of running children with real QEMU guests (issue 5): consistency, failure injection, concurrency,
branches of branches.

Live mode needs the child's memory file on tmpfs (userfaultfd write-protect covers anonymous, shmem and hugetlbfs
memory only). forkd keeps the flat images children map on tmpfs ($FORKD_SHM, default /dev/shm); these tests also
run in a FORKD_HOME of their own under /dev/shm, with the session's image. A child whose flat image is put on ext4
(FORKD_SHM pointing at a disk directory) checks that live mode by write-protect is refused there with a clear error,
and taken by pages instead by default.

A live branch is taken by the pages the source wrote (forkd.core.pipeline.branch_paged) when it can, else by QEMU's
write-protect capture; the tests of the write-protect path set FORKD_BRANCH_LIVE_CAPTURE=write-protect (fixture
`write_protect`), the ones of the pages path FORKD_BRANCH_LIVE_CAPTURE=pages, and each checks `capture`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from forkd.base.errors import Conflict
from forkd.core.branch import branch
from forkd.core.pipeline.branch import BranchError
from forkd.core.requests import Branch, Spawn
from forkd.store.snapshot import Snapshot
from tests.branching import WRITER, _mark, _seen

pytestmark = pytest.mark.vm


@pytest.fixture
def write_protect(monkeypatch):
    monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "write-protect")


@pytest.fixture
def by_pages(monkeypatch):
    monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "pages")


@pytest.mark.parametrize("capture", ["write-protect", "pages"])
def test_live_branch_of_a_child_writing_memory_is_consistent(srt, sfork, monkeypatch, capture):
    monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", capture)
    (c,) = sfork(1)
    assert srt.exec_code(c.id, WRITER)["error"] is None
    time.sleep(0.5)
    _mark(srt, c.id, "before")
    w0 = int(srt.eval(c.id, "WRITES[0]")["value"])
    tag = f"live1-{capture}"
    res = branch(srt, Branch.of(child_id=c.id, tag=tag, mode="live"))
    assert res.snapshot.status == "ready", res.snapshot.error
    assert res.capture == capture and res.snapshot.parent_tag is None  # self-contained either way
    _mark(srt, c.id, "after")
    # the source kept running: its writer advanced, it answers
    assert int(srt.eval(c.id, "WRITES[0]")["value"]) > w0
    assert srt.ping(c.id)["child_id"] == c.id
    snap = srt.store.get(tag)
    assert snap.status == "ready" and snap.memory_sha256 and snap.vmstate_sha256
    assert snap.labels["forkd.dev/branch-of"] == c.id and snap.labels["forkd.dev/branch-mode"] == "live"
    assert res.qemu_downtime_ms is not None and res.qemu_downtime_ms >= 0
    d = srt.store.dir(tag)
    for name in ("memory.bin", "vmstate", "snapshot.json"):
        assert (d / name).stat().st_mode & 0o777 == 0o400, name
    assert not any(p.name.startswith("b-") for p in srt.layout.tmp.iterdir())  # the work dir and stream are gone
    kids = sfork(2, tag=tag)
    for k in kids:
        assert _seen(srt, k.id) == ("before", "'before'")
        # the writer thread was captured mid-flight and keeps running in each child
        n0 = int(srt.eval(k.id, "WRITES[0]")["value"])
        assert n0 >= w0
        time.sleep(0.2)
        assert int(srt.eval(k.id, "WRITES[0]")["value"]) > n0
    assert _seen(srt, c.id) == ("after", "'after'")


@pytest.mark.parametrize("mode", ["full", "diff"])
def test_stop_modes_resume_the_source_and_capture_the_instant(srt, sfork, mode):
    (c,) = sfork(1)
    _mark(srt, c.id, "before")
    res = branch(srt, Branch.of(child_id=c.id, tag=f"stop-{mode}", mode=mode))
    assert res.snapshot.status == "ready" and res.pause_ms is not None
    assert srt.ping(c.id)["child_id"] == c.id
    _mark(srt, c.id, "after")
    (k,) = sfork(1, tag=f"stop-{mode}")
    assert _seen(srt, k.id) == ("before", "'before'")


def _caps(srt, cid: str, ensure_live: bool = False) -> dict[str, bool]:
    """The child's migration capabilities (QMP query); with `ensure_live`, also whether making it ready for a
    live branch had to set anything."""
    from forkd.vmm import capture
    from forkd.vmm.driver import RunFiles
    rec = srt.registry.get(cid)
    vm = srt.driver.attach(RunFiles(Path(rec.dir)), rec.pid, rec.started)
    try:
        srt.driver.connect(vm)
        have = capture.migration_caps(vm.qmp)
        out = {k: have[k] for k in ("background-snapshot", "x-ignore-shared")}
        if ensure_live:
            out["set"] = capture.ensure_caps(vm.qmp, x_ignore_shared=False, background_snapshot=True)
        return out
    finally:
        srt.driver.release(vm)


def test_capabilities_stay_set_between_branches_and_a_stop_branch_still_works(srt, sfork, write_protect):
    """A live branch leaves `background-snapshot` on (QEMU re-checks write-protect over all of RAM whenever
    capabilities are set while it is on: ~25-150 ms of a --no-wait branch's return), so the next live branch sets
    nothing; a full branch after it switches it off and still captures its own instant."""
    (c,) = sfork(1)
    assert _caps(srt, c.id) == {"background-snapshot": False, "x-ignore-shared": True}  # as restored
    _mark(srt, c.id, "one")
    assert branch(srt, Branch.of(child_id=c.id, tag="caps-live1", mode="live")).snapshot.status == "ready"
    assert _caps(srt, c.id, ensure_live=True) == {"background-snapshot": True, "x-ignore-shared": False, "set": False}
    _mark(srt, c.id, "two")
    assert branch(srt, Branch.of(child_id=c.id, tag="caps-live2", mode="live")).snapshot.status == "ready"
    _mark(srt, c.id, "three")
    assert branch(srt, Branch.of(child_id=c.id, tag="caps-full", mode="full")).snapshot.status == "ready"
    assert _caps(srt, c.id)["background-snapshot"] is False  # the full branch switched it off
    _mark(srt, c.id, "four")
    for tag, mark in (("caps-live1", "one"), ("caps-live2", "two"), ("caps-full", "three")):
        (k,) = sfork(1, tag=tag)
        assert _seen(srt, k.id) == (mark, repr(mark)), tag
    assert srt.ping(c.id)["child_id"] == c.id and _seen(srt, c.id) == ("four", "'four'")


def _mount_tmpfs(where: Path, opts: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "forkd-test", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.mark.parametrize("mode", ["live", "full"])
def test_full_destination_fails_the_snapshot_and_resumes_the_source(srt, sfork, tmp_path, mode, write_protect):
    """The write-protect capture streams all of RAM through tmp_dir (a capture by pages writes only its pages)."""
    (c,) = sfork(1)
    small = tmp_path / "small"
    _mount_tmpfs(small, "size=16m")
    try:
        with pytest.raises(Exception) as ei:  # noqa: B017 - the stream write fails (no space left)
            branch(srt, Branch.of(child_id=c.id, tag=f"nospace-{mode}", mode=mode, tmp_dir=small))
        # live: refused up front (a QEMU 7.2 background snapshot failing mid-stream hangs the source);
        # full: the stream write fails mid-way with ENOSPC while the source is stopped, and it is resumed
        assert "stream" in str(ei.value) or "space" in str(ei.value).lower()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    snap = srt.store.get(f"nospace-{mode}")
    assert snap.status == "failed" and snap.error
    assert not (srt.store.dir(snap.tag) / "memory.bin").exists()
    assert srt.ping(c.id)["child_id"] == c.id
    assert srt.eval(c.id, "1 + 1")["value"] == "2"
    with pytest.raises(Conflict):  # a failed snapshot is never forked from
        srt.fork(Spawn.of(tag=snap.tag, n=1))
    # and the source can be branched again afterwards (capabilities and locks were reset)
    assert branch(srt, Branch.of(child_id=c.id, tag=f"retry-{mode}", mode=mode)).snapshot.status == "ready"


def test_unwritable_destination_fails_cleanly(srt, sfork, tmp_path):
    (c,) = sfork(1)
    ro = tmp_path / "ro"
    _mount_tmpfs(ro, "size=1m,ro")
    try:
        with pytest.raises(BranchError, match=r"cannot make the branch's work directory in .*/ro: Read-only") as ei:
            branch(srt, Branch.of(child_id=c.id, tag="unwritable", mode="full", tmp_dir=ro))
        assert isinstance(ei.value.__cause__, OSError) and "writable" in ei.value.hint  # a ForkdError, not a 500
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    assert srt.store.get("unwritable").status == "failed"
    assert srt.ping(c.id)["child_id"] == c.id


def test_concurrent_branches_of_one_source_and_the_global_cap(srt, sfork, write_protect):
    """The source stays locked while its RAM streams (write-protect: a capture by pages frees it at the resume)."""
    a, b, c = sfork(3)
    assert srt.exec_code(a.id, WRITER)["error"] is None  # a busy source: its stream takes a while
    first = branch(srt, Branch.of(child_id=a.id, tag="conc1", mode="live", wait=False))
    assert first.snapshot.status == "writing"
    with pytest.raises(Conflict) as ei:
        branch(srt, Branch.of(child_id=a.id, tag="conc2", mode="live"))
    assert a.id in str(ei.value)
    second = branch(srt, Branch.of(child_id=b.id, tag="conc3", mode="live", wait=False))  # the 2nd slot
    with pytest.raises(Conflict) as ei:
        branch(srt, Branch.of(child_id=c.id, tag="conc4", mode="live"))
    assert "in flight" in str(ei.value)
    for tag in ("conc2", "conc4"):  # a refused branch leaves no snapshot behind
        assert tag not in [s.tag for s in srt.snapshots() if isinstance(s, Snapshot)]
    with pytest.raises(Conflict):  # spawning from a `writing` snapshot is refused
        if srt.store.get("conc1").status == "writing":
            srt.fork(Spawn.of(tag="conc1", n=1))
        else:
            raise Conflict("already converted")
    first.thread.join(120)
    second.thread.join(120)
    assert srt.store.get("conc1").status == "ready" and srt.store.get("conc3").status == "ready"
    assert branch(srt, Branch.of(child_id=c.id, tag="conc4", mode="live")).snapshot.status == "ready"


def test_grandchildren_of_a_branch_branch_again(srt, sfork):
    (c,) = sfork(1)
    _mark(srt, c.id, "gen1")
    assert branch(srt, Branch.of(child_id=c.id, tag="gen1", mode="live")).snapshot.status == "ready"
    kids = sfork(3, tag="gen1")
    for k in kids:
        assert _seen(srt, k.id) == ("gen1", "'gen1'")
    _mark(srt, kids[0].id, "gen2")
    res = branch(srt, Branch.of(child_id=kids[0].id, tag="gen2", mode="live", wait=False))
    assert res.snapshot.status == "writing"
    res.thread.join(120)
    assert srt.store.get("gen2").status == "ready"
    (g,) = sfork(1, tag="gen2")
    assert _seen(srt, g.id) == ("gen2", "'gen2'")
    assert _seen(srt, kids[1].id) == ("gen1", "'gen1'")


def test_live_branch_by_write_protect_refused_when_memory_is_not_on_tmpfs_and_by_pages_taken(rt, fork, monkeypatch):
    disk = Path(tempfile.mkdtemp(prefix="fkdisk", dir="/var/tmp"))
    monkeypatch.setenv("FORKD_SHM", str(disk))  # flat images on ext4 for this child
    (c,) = fork(1)
    try:
        assert str(disk) in open(f"/proc/{c.pid}/cmdline").read()
        monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "write-protect")
        with pytest.raises(Conflict) as ei:
            branch(rt, Branch.of(child_id=c.id, tag="never", mode="live"))
        assert "tmpfs" in str(ei.value) and c.id in str(ei.value)
        with pytest.raises(Exception):  # noqa: B017 - nothing was created under that tag
            rt.store.get("never")
        assert rt.ping(c.id)["child_id"] == c.id
        monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "pages")  # userfaultfd is not needed for this one
        rt.exec_code(c.id, "ON_EXT4 = 1")
        res = branch(rt, Branch.of(child_id=c.id, tag="ext4-pages", mode="live"))
        assert res.snapshot.status == "ready" and res.capture == "pages", res.snapshot.error
        (k,) = fork(1, tag="ext4-pages")
        assert rt.eval(k.id, "ON_EXT4")["value"] == "1"
        rt.kill([k.id])
        rt.rmi("ext4-pages")
    finally:
        rt.kill([c.id])
        shutil.rmtree(disk, ignore_errors=True)


def test_no_wait_live_branch_returns_at_the_stop_and_holds_that_instant(srt, sfork, write_protect):
    """A live wait=False branch returns once the source stopped for the capture (not after its resume): what the
    caller does to the source right after the return is not in the snapshot; the source resumes by itself."""
    (c,) = sfork(1)
    _mark(srt, c.id, "at-call")
    res = branch(srt, Branch.of(child_id=c.id, tag="early", mode="live", wait=False))
    assert res.snapshot.status == "writing" and "stopped" in res.timings_ms
    _mark(srt, c.id, "after-return")  # waits for the resume if the source has not resumed yet
    res.thread.join(300)
    snap = srt.store.get("early")
    assert snap.status == "ready", snap.error
    t = res.timings_ms  # filled on by the background thread: compared after it ended, not at the return
    assert t["resumed"] >= t["stopped"] and res.pause_ms is not None
    # the resume was awaited by the background steps, after the call returned (an ordering, not a time: how long
    # the return took against the resume depends on the machine's load)
    assert "resume_wait" in t and "stopped" in t, t
    (k,) = sfork(1, tag="early")
    assert _seen(srt, k.id) == ("at-call", "'at-call'")
    assert _seen(srt, c.id) == ("after-return", "'after-return'")


def test_no_wait_live_branch_by_pages_returns_with_the_source_running(srt, sfork, by_pages):
    """By pages, a wait=False live branch returns once the source runs again, its pages and device state taken;
    the snapshot (sealed in the background) is self-contained and holds the instant of the call; the source is
    free at once (a second branch of it does not wait for the first one's seal)."""
    (c,) = sfork(1)
    _mark(srt, c.id, "at-call")
    res = branch(srt, Branch.of(child_id=c.id, tag="early-pages", mode="live", wait=False))
    assert res.snapshot.status == "writing" and res.capture == "pages" and res.pause_ms is not None
    _mark(srt, c.id, "after-return")
    second = branch(srt, Branch.of(child_id=c.id, tag="early-pages2", mode="live"))
    assert second.snapshot.status == "ready" and second.capture == "pages", second.snapshot.error
    res.thread.join(300)
    snap = srt.store.get("early-pages")
    assert snap.status == "ready" and snap.parent_tag is None, snap.error
    (k,) = sfork(1, tag="early-pages")
    assert _seen(srt, k.id) == ("at-call", "'at-call'")
    (k2,) = sfork(1, tag="early-pages2")
    assert _seen(srt, k2.id) == ("after-return", "'after-return'")


def test_live_branch_takes_write_protect_when_the_source_wrote_too_much_or_its_agent_is_held(srt, sfork,
                                                                                               monkeypatch, unprimed):
    """By default (auto) a live branch is taken by pages only while the source wrote at most 1/40 of its RAM and
    nobody else holds its agent; otherwise by write-protect, saying why. With FORKD_BRANCH_LIVE_CAPTURE=pages it
    refuses instead (Conflict, nothing written). Unprimed: the first branch counts what the source wrote since its
    fork, which a prime adds to."""
    from forkd.vmm.agent_client import AgentClient
    from forkd.vmm.driver import RunFiles

    c, d = sfork(2)
    res = branch(srt, Branch.of(child_id=c.id, tag="auto-pages", mode="live"))
    assert res.capture == "pages" and res.capture_note is None and res.timings_ms["written_pages"] > 0
    assert srt.exec_code(c.id, "X = bytearray(32 << 20)\nfor i in range(0, len(X), 4096): X[i] = 1")["error"] is None
    res = branch(srt, Branch.of(child_id=c.id, tag="auto-wp", mode="live"))
    assert res.snapshot.status == "ready" and res.capture == "write-protect", res.snapshot.error
    assert "wrote" in res.capture_note and "1/40" in res.capture_note
    (k,) = sfork(1, tag="auto-wp")
    assert srt.eval(k.id, "len(X)")["value"] == str(32 << 20)
    held = AgentClient(RunFiles(Path(srt.registry.get(d.id).dir)).agent)  # d wrote little: held, not pages
    try:
        held.ping()
        res = branch(srt, Branch.of(child_id=d.id, tag="auto-held", mode="live"))
        monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "pages")
        with pytest.raises(Conflict, match=f"child {d.id} cannot be branched live by pages.*agent") as refused:
            branch(srt, Branch.of(child_id=d.id, tag="pages-held", mode="live"))
        assert "FORKD_BRANCH_LIVE_CAPTURE=auto" in refused.value.hint
    finally:
        held.close()
    assert res.snapshot.status == "ready" and res.capture == "write-protect", res.snapshot.error
    assert "agent" in res.capture_note
    assert not srt.store.dir("pages-held").exists() and srt.eval(d.id, "1+1")["value"] == "2"


def test_cli_branch_no_wait(srt, sfork):
    (c,) = sfork(1)
    env = dict(os.environ, FORKD_HOME=str(srt.layout.home))
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "branch", c.id, "--tag", "cli1", "--no-wait",
                          "-o", "json"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["snapshot"]["status"] == "writing" and data["source"] == c.id
    assert srt.store.get("cli1").status == "ready"  # the CLI waited for its conversion before exiting
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "branch", c.id, "--tag", "cli1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 4 and "already exists" in res.stderr


def test_forkbranch_object_branches_once_and_feeds_a_pool(srt, sfork):
    """The reconciler's ForkBranch: snapshot a running child once, then keep a pool of its children warm."""
    from forkd.reconciler.control import Control
    from forkd.spec.loader import load_text

    (c,) = sfork(1)
    assert srt.exec(c.id, ["sh", "-c", "echo from-branch > /root/marker"])["exit_code"] == 0
    srt.exec_code(c.id, "BRANCH_MARK = 42")
    spec = (f"apiVersion: forkd.dev/v1alpha1\nkind: ForkBranch\nmetadata: {{name: step7}}\n"
            f"spec: {{sandbox: {c.id}, mode: live}}\n---\n"
            "apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\nmetadata: {name: after-step7}\n"
            "spec: {from: step7, warm: 1}\n")
    loaded, errors = load_text(spec, "branch.yaml")
    assert not errors
    control = Control(srt)
    control.apply([(x.obj, "branch.yaml") for x in loaded], "branch-test")
    try:
        ok, problems = control.reconciler.run_until_converged(240)
        assert ok, problems
        b = control.get("ForkBranch", "step7")[0]
        assert b.status.condition("Ready").status == "True"
        (kid,) = [r for r in srt.children() if r.pool == "after-step7" and r.status == "running"]
        assert kid.snapshot == b.status.snapshot
        assert srt.exec(kid.id, ["cat", "/root/marker"])["stdout"] == "from-branch\n"
        assert srt.eval(kid.id, "BRANCH_MARK")["value"] == "42"
        assert srt.ping(c.id)["child_id"] == c.id  # the source kept running
        events = [e["message"] for e in control.describe("ForkBranch", "step7")["events"]]
        assert any("branched" in m and "(live" in m for m in events)
    finally:
        control.delete("ForkPool", "after-step7")
        control.delete("ForkBranch", "step7")
        for _ in range(3):
            control.reconciler.step()
        control.reconciler.close()
    assert not [r for r in srt.children() if r.pool == "after-step7"]
    assert not [s for s in srt.store.list() if getattr(s, "labels", {}).get("forkd.dev/branch") == "step7"]


@pytest.mark.parametrize("mode", ["live", "live-pages", "full", "diff"])
def test_process_killed_mid_branch_leaves_a_failed_snapshot_and_a_running_source(srt, sfork, mode):
    """kill -9 the process that is branching: at the next start (recover) the snapshot is failed and the source,
    which QEMU may have left paused (full mode pauses it), runs and answers again. Live mode is killed while RAM
    streams: QEMU 7.2 then hung the source for good (main loop and vCPUs in handle_userfault) until the stream's
    pump became a process of its own (forkd.vmm.stream_pump)."""
    (c,) = sfork(1)
    tag = f"killed-{mode}"
    env = dict(os.environ, FORKD_HOME=str(srt.layout.home),
               FORKD_BRANCH_LIVE_CAPTURE="pages" if mode == "live-pages" else "write-protect")
    proc = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "branch", c.id, "--tag", tag, "--mode",
                             mode.split("-")[0]],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = srt.store.dir(tag) / "snapshot.json"
    deadline = time.monotonic() + 60
    while not (manifest.exists() and json.loads(manifest.read_text())["status"] == "writing"):
        assert proc.poll() is None and time.monotonic() < deadline, "branch never started writing"
        time.sleep(0.005)
    if mode == "live":  # kill it while RAM streams: the phase in which a broken stream hung the source
        while not any(f.stat().st_size > 0 for f in (srt.layout.home / "tmp").glob("*/stream")):
            assert proc.poll() is None and time.monotonic() < deadline, "the branch stream never started"
            time.sleep(0.002)
    proc.kill()
    proc.wait()
    assert srt.recover() == [tag]
    assert srt.store.get(tag).status == "failed"
    assert srt.child(c.id).status == "running"
    assert srt.ping(c.id)["child_id"] == c.id
    assert srt.exec(c.id, ["true"], timeout=30)["exit_code"] == 0
    srt.rmi(tag)


def test_upstream_cli_spelling_snapshot_from_sandbox(srt, sfork):
    (c,) = sfork(1)
    env = dict(os.environ, FORKD_HOME=str(srt.layout.home))
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "snapshot", "--from-sandbox", c.id, "--tag",
                          "upstream-spelling", "--diff", "-o", "json"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["snapshot"]["status"] == "ready"
    assert srt.store.get("upstream-spelling").labels["forkd.dev/branch-mode"] == "diff"
    srt.rmi("upstream-spelling")
