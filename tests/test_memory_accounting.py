"""Memory accounting of children with real VMs (issue 15, findings 1-3).

The model: a flat image (the guest RAM children map MAP_PRIVATE) is populated in full when it enters the flat
cache and charged once to forkd's own `shared` cgroup; a child's cgroup is charged only for what the child itself
allocates: the guest pages it writes (private copies), its VMM's heap, its page tables. A live branch reads every
guest page of its source but allocates nothing in the source's group, so it never pushes the source over its
limit. When a branch fails because its source died, the error says so (`oom-killed`, `dead`) and keeps the
original failure.

These tests run in a FORKD_HOME of their own under /dev/shm (live branch needs the snapshot on tmpfs, as in
tests/test_branch.py) and need the memory controller (v1 or v2)."""

from __future__ import annotations

import os

import pytest

from forkd.base.errors import ForkdError
from forkd.core.branch import branch
from forkd.core.requests import Branch, ParentBuild
from forkd.sandbox import cgroups
from tests.branching import tmpfs_runtime, tracked_forks

pytestmark = pytest.mark.vm
MBASE = "mbase"
LIMIT = 256  # upstream MCP server's spawn_sandboxes default
ALLOC_MIB = 96  # what a test guest allocates and writes (fresh guest pages: holes of the flat image)


@pytest.fixture(scope="module")
def mrt(rt):
    """A runtime whose store is on tmpfs, sharing the session's image; one 512 MiB parent."""
    if cgroups.detect() is None:
        pytest.skip("no memory cgroup controller here")
    with tmpfs_runtime(rt, "fkmem", ParentBuild.of(tag=MBASE, memory_mib=512, warm_imports=("decimal",))) as r:
        yield r


@pytest.fixture
def mfork(mrt):
    yield from tracked_forks(mrt, MBASE)


def shmem_mib(group: cgroups.ChildCgroup) -> float:
    """tmpfs pages charged to a child's memory group (v1 and v2 memory.stat both name them `shmem`)."""
    for line in (group.memory_path / "memory.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == "shmem":
            return int(v) / (1 << 20)
    raise AssertionError("memory.stat has no shmem line")


def test_live_branch_of_a_memory_limited_child_keeps_it_alive(mrt, mfork):
    """Finding 1: a 256 MiB-limited child of a 512 MiB snapshot, one exec, then a live branch."""
    (c,) = mfork(1, memory_limit_mib=LIMIT)
    assert mrt.exec(c.id, ["sh", "-c", "echo hello"])["stdout"].strip() == "hello"
    res = branch(mrt, Branch.of(child_id=c.id, tag="limited-live", mode="live"))
    assert res.snapshot.status == "ready"
    g = cgroups.from_record(c.cgroup)
    assert g.oom_kills() == 0
    assert mrt.child(c.id).status == "running"
    assert mrt.eval(c.id, "6 * 7")["value"] == "42"
    assert shmem_mib(g) < 8, "the branch's reads were charged to its source"
    # and the branch is a good snapshot: a child of it answers
    (b,) = mfork(1, tag="limited-live", memory_limit_mib=LIMIT)
    assert mrt.exec(b.id, ["sh", "-c", "echo again"])["stdout"].strip() == "again"


def _write_fresh_memory(rt, cid: str, mib: int) -> None:
    """The guest allocates and writes `mib` MiB it never touched before (fresh guest pages: holes of the image)."""
    res = rt.exec_code(cid, f"X = bytearray({mib} << 20)\nfor i in range(0, len(X), 4096):\n    X[i] = 1\n",
                       timeout=120)
    assert res.get("error") is None, res


def test_shared_guest_ram_is_charged_once_to_forkd_and_children_only_for_what_they_write(mrt, mfork):
    """Finding 2: the first sibling to touch a hole of the shared image used to pay for it (and fill it for good);
    now the image is whole and forkd's, and siblings doing the same work are charged the same."""
    home = str(mrt.layout.home)
    shared = cgroups.shared_group(home)
    assert shared is not None and shared.name == cgroups.SHARED
    assert shared not in cgroups.home_groups(home)  # not a child group: gc leaves it alone
    flat = mrt.store.materialize(MBASE)
    flat.unlink()  # rebuilt from the store: every page charged to the shared group, none to a child
    before = cgroups.shmem_bytes(shared)
    flat = mrt.store.materialize(MBASE)
    st = os.stat(flat)
    assert st.st_blocks * 512 >= st.st_size, "the flat image is still sparse: a child's fault would allocate"
    assert cgroups.shmem_bytes(shared) - before >= st.st_size
    a, b = mfork(2, memory_limit_mib=LIMIT)
    for c in (a, b):
        _write_fresh_memory(mrt, c.id, ALLOC_MIB)
    ga, gb = cgroups.from_record(a.cgroup), cgroups.from_record(b.cgroup)
    assert shmem_mib(ga) < 8 and shmem_mib(gb) < 8, (shmem_mib(ga), shmem_mib(gb))
    assert os.stat(flat).st_blocks == st.st_blocks  # the shared image did not grow
    assert mrt.child(a.id).status == mrt.child(b.id).status == "running"


def _gone(pid: int) -> None:
    """Wait until `pid` has exited (a zombie counts: forkd sees it as gone)."""
    import time

    from forkd.base.procs import start_time

    deadline = time.monotonic() + 30
    while start_time(pid) is not None:
        assert time.monotonic() < deadline, f"pid {pid} did not exit"
        time.sleep(0.05)


def _hook_capture(monkeypatch, after: str, then) -> None:
    """Run `then(vm)` right after the capture's `after` method (the branch's own code continues afterwards)."""
    from forkd.vmm.qemu import QemuDriver

    orig = QemuDriver.open_capture

    def open_capture(self, vm, stream, live):
        cap = orig(self, vm, stream, live)
        inner = getattr(cap, after)

        def hooked(*a, **kw):
            out = inner(*a, **kw)
            then(vm)
            return out

        setattr(cap, after, hooked)
        return cap

    monkeypatch.setattr(QemuDriver, "open_capture", open_capture)


def _assert_source_lost(mrt, exc: BaseException, tag: str, fate: str) -> None:
    from forkd.core.pipeline.branch import SourceLost

    assert isinstance(exc, SourceLost), f"{type(exc).__name__}: {exc}"
    assert exc.fate == fate and f"is {fate}" in exc.message
    assert exc.http_status == 409 and exc.exit_code == 4  # the daemon answers 409 with this message, never 500
    assert exc.__cause__ is not None and type(exc.__cause__).__name__ in exc.message  # the original is kept
    snap = mrt.store.get(tag)
    assert snap.status == "failed" and fate in snap.error


def test_source_killed_mid_branch_reports_dead_and_keeps_the_cause(mrt, mfork, monkeypatch):
    """Finding 3 (the path of finding 1): the source dies right after the capture started, so waiting for it and
    resuming it both hit a dead QMP socket; the resume's failure must not replace the real one."""
    (c,) = mfork(1, memory_limit_mib=LIMIT)

    def kill(vm):
        os.kill(vm.pid, 9)
        _gone(vm.pid)

    monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "write-protect")  # the hook is on its capture
    _hook_capture(monkeypatch, "start", kill)
    with pytest.raises(ForkdError) as ei:
        branch(mrt, Branch.of(child_id=c.id, tag="killed-live", mode="live"))
    _assert_source_lost(mrt, ei.value, "killed-live", "dead")
    assert mrt.child(c.id).status == "dead"


def test_source_oom_killed_mid_branch_reports_oom_killed(mrt, mfork, monkeypatch):
    """Finding 3: the source goes over its own limit (its guest allocates past it) while its stream is being
    written; the branch says the child was OOM-killed, with the original error."""
    (c,) = mfork(1, memory_limit_mib=LIMIT)

    def hog(vm):
        with pytest.raises(ForkdError):
            mrt.exec_code(c.id, f"X = bytearray({LIMIT + 64} << 20)", timeout=120)
        _gone(vm.pid)

    monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", "write-protect")  # the hook is on its capture
    _hook_capture(monkeypatch, "wait_resumed", hog)
    with pytest.raises(ForkdError) as ei:
        branch(mrt, Branch.of(child_id=c.id, tag="oom-live", mode="live"))
    _assert_source_lost(mrt, ei.value, "oom-live", "oom-killed")
    assert mrt.child(c.id).status == "oom-killed"
    assert f"{LIMIT} MiB" in ei.value.message
