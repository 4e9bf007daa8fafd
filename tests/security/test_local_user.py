"""Local user -> guest RAM and forkd's files (issue 14, finding 2; SECURITY.md section 2).

The attacker is a real unprivileged user: a forked child that drops to uid/gid 65534 (nobody) before trying. The
stores live in homes other users can traverse (0755, like /var/lib/forkd) and on the real tmpfs ($FORKD_SHM,
default /dev/shm), so only forkd's own directory and file modes stand between the attacker and the RAM.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from forkd.base.errors import ForkdError
from forkd.base.paths import Layout
from forkd.core.pipeline.job import Job
from forkd.core.runtime import Runtime
from forkd.sandbox import gc
from forkd.store.snapshot import Snapshot
from forkd.store.store import SnapshotStore
from forkd.vmm.qemu import find_qemu

NOBODY = 65534
SECRET = b"guest secret " * 300


# -- the attacker -----------------------------------------------------------------------------------------------
def as_nobody(fn, *args) -> str:
    """Run fn(*args) in a forked child as uid/gid 65534 with no supplementary groups; its str result, or the name
    of the exception it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                out = str(fn(*args))
            except BaseException as exc:  # noqa: BLE001
                out = f"{type(exc).__name__}: {exc}"
            os.write(w, out.encode()[:60000])
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def read_file(path: str) -> str:
    with open(path, "rb") as f:
        return f"READ {len(f.read())} bytes"


def write_file(path: str) -> str:
    with open(path, "r+b") as f:
        f.write(b"evil")
    return "WROTE"


def find_ram(roots: list[str]) -> str:
    """Everything an attacker can find below `roots`: file names it can list (ending .mem / memory.bin / vmstate)."""
    found = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            found += [os.path.join(dirpath, f) for f in files
                      if f.endswith(".mem") or f in ("memory.bin", "vmstate", "diff.data")]
    return "\n".join(found)


def mkdir_as_nobody(path: str, mode: int = 0o777) -> str:
    os.mkdir(path)
    os.chmod(path, mode)
    return "MADE"


def plant(path: str, target: str) -> str:
    os.symlink(target, path)
    return "PLANTED"


def assert_denied(path: Path) -> None:
    for op in (read_file, write_file):
        got = as_nobody(op, str(path))
        assert got.startswith(("PermissionError", "FileNotFoundError")), f"{op.__name__} {path}: {got}"


# -- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture
def open_home():
    """A home any user may traverse (0755, like /var/lib/forkd); flat images on the real tmpfs."""
    d = Path(tempfile.mkdtemp(prefix="fksec", dir="/tmp"))
    os.chmod(d, 0o755)
    home = d / "home"
    home.mkdir(mode=0o755)
    layout = Layout(home)
    shm_dir = layout.flat_cache.parent
    yield layout
    for p in (shm_dir, d):
        if p.is_symlink():
            p.unlink()
        shutil.rmtree(p, ignore_errors=True)


def _record(tag: str) -> Snapshot:
    return Snapshot(tag=tag, status="writing", created_at=time.time(), memory_mib=1, vcpus=1, accel="tcg",
                    image_id="img", kernel_sha256="k", qemu_version="q")


def _write_snapshot(store: SnapshotStore, tag: str, in_place: bool = False) -> Snapshot:
    """A snapshot whose memory is SECRET: from a scratch file (a parent build) or written in place (a branch)."""
    with store.writing(_record(tag)) as w:
        w.vmstate.write_bytes(SECRET)
        if in_place:
            w.memory.write_bytes(SECRET)
            return w.seal(memory=w.memory, vmstate=w.vmstate)
        scratch = store.layout.tmp / f"forkd-t-{os.getpid()}-{secrets.token_hex(16)}.mem"
        scratch.write_bytes(SECRET)
        w.seal(memory=scratch, vmstate=w.vmstate)
    return store.get(tag)


def _tmpfs_dir(layout: Layout) -> Path:
    d = layout.flat_cache.parent
    assert d.name.startswith("forkd-"), f"these tests need a tmpfs at $FORKD_SHM ({d})"
    return d


# -- guest RAM at rest: unreadable and unwritable by other users ------------------------------------------------
def test_snapshot_memory_and_vmstate_are_private(open_home):
    store = SnapshotStore(open_home)
    _write_snapshot(store, "s1")
    d = store.dir("s1")
    for name in ("memory.bin", "vmstate"):
        assert (d / name).stat().st_mode & 0o777 == 0o400, name
        assert_denied(d / name)
    assert d.stat().st_mode & 0o777 == 0o700 and store.root.stat().st_mode & 0o777 == 0o700
    assert as_nobody(find_ram, [str(open_home.home)]) == ""


def test_branch_snapshot_memory_written_in_place_is_private(open_home):
    store = SnapshotStore(open_home)
    _write_snapshot(store, "br", in_place=True)
    for name in ("memory.bin", "vmstate"):
        assert_denied(store.dir("br") / name)


def test_flat_image_is_private_on_tmpfs(open_home):
    store = SnapshotStore(open_home)
    _write_snapshot(store, "s1")
    flat = store.materialize("s1")
    assert flat.read_bytes() == SECRET
    assert flat.stat().st_mode & 0o777 == 0o400
    assert_denied(flat)
    shm_dir = _tmpfs_dir(open_home)
    for d in (shm_dir, flat.parent):
        st = d.lstat()
        assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700, d
    assert as_nobody(find_ram, [str(shm_dir)]) == ""
    # hard-link variant: keeping a link to the image (to read it later, or after forkd dropped it) is impossible
    keep = shm_dir.parent / f"keep-{secrets.token_hex(8)}"
    assert as_nobody(os.link, str(flat), str(keep)).startswith("PermissionError")
    assert not keep.exists()


def _qemu_maps(path: Path) -> subprocess.Popen:
    """A real QEMU opening `path` as its RAM the way a parent build does (share=on), without a guest."""
    qemu = find_qemu()
    if qemu is None:
        pytest.skip("no qemu-system-x86_64")
    proc = subprocess.Popen([qemu, "-M", "none", "-S", "-nodefaults", "-display", "none", "-object",
                             f"memory-backend-file,id=ram,size=4M,mem-path={path},share=on,prealloc=on"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (path.exists() and path.stat().st_size == 4 << 20):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "QEMU never mapped its RAM file"
        time.sleep(0.05)
    return proc


def test_parent_scratch_ram_is_created_private_and_unfindable(open_home):
    rt = Runtime(open_home)
    job = Job(rt)
    with job.stack:
        path = job.scratch_memory("victim", 1)
        qemu = _qemu_maps(path)
        try:
            with open(path, "r+b") as f:  # what the guest writes into its RAM
                f.write(SECRET)
            st = path.lstat()
            assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0, oct(st.st_mode)
            assert_denied(path)
            # the name is not guessable and not listable: nothing found where the attacker can look
            shm = rt.layout.flat_cache.parent.parent
            assert as_nobody(find_ram, [str(rt.layout.home), str(rt.layout.flat_cache.parent)]) == ""
            assert not [p for p in as_nobody(os.listdir, str(shm)) if "victim" in p]
            assert len(path.name.rsplit("-", 1)[1].split(".")[0]) >= 32
        finally:
            os.killpg(qemu.pid, signal.SIGKILL)
            qemu.wait()
    assert not path.exists()


# -- directories somebody else made: refused, never written through ----------------------------------------------
@pytest.mark.parametrize("who", ["nobody", "root-0777", "symlink", "symlink-chain"])
def test_foreign_tmpfs_dir_is_refused_and_never_written_through(open_home, who, tmp_path, request):
    store = SnapshotStore(open_home)
    _write_snapshot(store, "s1")
    shm_dir = _tmpfs_dir(open_home)
    shutil.rmtree(shm_dir, ignore_errors=True)  # as after a reboot: the attacker is first
    victim = tmp_path / "victim"
    victim.mkdir()
    if who == "nobody":
        assert as_nobody(mkdir_as_nobody, str(shm_dir)) == "MADE"
        assert as_nobody(plant, str(shm_dir / "home"), str(tmp_path / "victim" / "owned")) == "PLANTED"
    elif who == "root-0777":
        shm_dir.mkdir()
        os.chmod(shm_dir, 0o777)
    elif who == "symlink":
        os.chmod(tmp_path, 0o755)
        assert as_nobody(plant, str(shm_dir), str(victim)) == "PLANTED"
    else:  # a chain: forkd-<hash> -> a link of the attacker's -> root's directory
        os.chmod(tmp_path, 0o755)
        hop = shm_dir.parent / f"hop-{secrets.token_hex(8)}"
        request.addfinalizer(lambda: hop.unlink(missing_ok=True))
        assert as_nobody(plant, str(hop), str(victim)) == "PLANTED"
        assert as_nobody(plant, str(shm_dir), str(hop)) == "PLANTED"
    with pytest.raises(ForkdError) as ei:
        store.materialize("s1")
    assert str(shm_dir) in str(ei.value) and ei.value.hint
    with pytest.raises(ForkdError):
        Job(Runtime(open_home)).scratch_memory("x", 1)
    assert list(victim.iterdir()) == []  # root wrote nothing through the planted link
    if not shm_dir.is_symlink():
        assert [p.name for p in shm_dir.iterdir()] == (["home"] if who == "nobody" else [])
    if shm_dir.is_symlink():
        shm_dir.unlink()
    else:
        shutil.rmtree(shm_dir)
    assert store.materialize("s1").read_bytes() == SECRET  # once removed, forkd makes its own


def test_planted_flat_image_symlink_is_never_mapped(open_home, tmp_path):
    """The attacker owns the flat-image directory and plants `<content hash>.mem` -> a root-owned file: forkd must
    not hand that path to a VMM (before: `materialize` returned it as is)."""
    store = SnapshotStore(open_home)
    snap = _write_snapshot(store, "s1")
    shm_dir = _tmpfs_dir(open_home)
    shutil.rmtree(shm_dir, ignore_errors=True)
    root_file = tmp_path / "root-owned"
    root_file.write_bytes(b"root's data")
    os.chmod(tmp_path, 0o755)
    assert as_nobody(mkdir_as_nobody, str(shm_dir)) == "MADE"
    assert as_nobody(mkdir_as_nobody, str(shm_dir / "flat")) == "MADE"
    assert as_nobody(plant, str(shm_dir / "flat" / f"{snap.memory_sha256}.mem"), str(root_file)) == "PLANTED"
    try:
        got = store.materialize("s1")
    except ForkdError as exc:
        assert str(shm_dir) in str(exc)
    else:
        pytest.fail(f"materialize handed out {got} (-> {os.path.realpath(got)})")
    assert root_file.read_bytes() == b"root's data"
    shutil.rmtree(shm_dir)


@pytest.mark.parametrize("how", ["chmod", "chown"])
def test_materialize_rechecks_an_existing_flat_image_directory(open_home, how):
    store = SnapshotStore(open_home)
    _write_snapshot(store, "s1")
    flat = store.materialize("s1")
    if how == "chmod":
        os.chmod(flat.parent, 0o777)
    else:
        os.chown(flat.parent, NOBODY, NOBODY)
    with pytest.raises(ForkdError) as ei:
        store.materialize("s1")
    assert str(flat.parent) in str(ei.value)


def test_a_home_subdirectory_made_by_another_user_is_refused(open_home):
    Runtime(open_home)
    shutil.rmtree(open_home.tmp)
    os.chmod(open_home.home, 0o777)  # a careless home: anyone may make tmp/ in it, so it is refused as such
    with pytest.raises(ForkdError) as ei:
        Runtime(open_home)
    assert str(open_home.home) in str(ei.value) and "chmod go-w" in ei.value.hint
    assert as_nobody(mkdir_as_nobody, str(open_home.tmp), 0o755) == "MADE"
    os.chmod(open_home.home, 0o755)  # fixed later, but tmp/ is still the other user's
    with pytest.raises(ForkdError) as ei:
        Runtime(open_home)
    assert str(open_home.tmp) in str(ei.value) and f"uid {NOBODY}" in str(ei.value)


def test_home_subdirectories_are_private(open_home):
    rt = Runtime(open_home)
    for d in (rt.layout.images, rt.layout.cache, rt.layout.snapshots, rt.layout.children, rt.layout.objects,
              rt.layout.tmp):
        assert d.stat().st_mode & 0o777 == 0o700, d
    # an older forkd's 0755 directories (owned by forkd's user) are tightened, not refused
    os.chmod(rt.layout.snapshots, 0o755)
    Runtime(open_home)
    assert rt.layout.snapshots.stat().st_mode & 0o777 == 0o700


# -- the helper -----------------------------------------------------------------------------------------------
def test_private_helpers_never_follow_a_symlink(tmp_path):
    from forkd.base.private import UnsafePath, create_private_file, ensure_private_dir

    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UnsafePath, match="symbolic link"):
        ensure_private_dir(tmp_path / "link")
    d = ensure_private_dir(tmp_path / "mine")
    assert d.lstat().st_mode & 0o777 == 0o700
    (d / "f.mem").symlink_to(target / "x")
    with pytest.raises(FileExistsError):
        create_private_file(d / "f.mem")
    assert not (target / "x").exists()
    fd = create_private_file(d / "g.mem")
    os.close(fd)
    assert (d / "g.mem").lstat().st_mode & 0o777 == 0o600


def test_gc_recognises_scratch_files_and_spares_other_users_files(open_home, monkeypatch):
    from forkd.base.private import create_private_file

    shm = open_home.home.parent / "shm"  # a shared tmpfs of this test's own (another gc may sweep /dev/shm)
    shm.mkdir()
    os.chmod(shm, 0o1777)
    monkeypatch.setenv("FORKD_SHM", str(shm))
    rt = Runtime(open_home)
    dead = 4_000_000 - 7  # above pid_max: never alive
    scratch = rt.layout.scratch_dir() / f"forkd-p1-{dead}-{secrets.token_hex(16)}.mem"
    os.close(create_private_file(scratch))
    os.utime(scratch, (time.time() - 10, time.time() - 10))
    theirs = shm / f"forkd-p1-{dead}-{secrets.token_hex(4)}.mem"
    assert as_nobody(lambda p: open(p, "w").close() or "MADE", str(theirs)) == "MADE"
    try:
        os.utime(theirs, (time.time() - 10, time.time() - 10))
        report = gc.collect(rt.layout)
        assert str(scratch) in report.memory_files and not scratch.exists()
        assert str(theirs) not in report.memory_files and theirs.exists()
    finally:
        theirs.unlink(missing_ok=True)


# -- end to end, real VMs: the VMM still opens everything it needs, per-child users included ------------------
@pytest.mark.vm
def test_per_child_vmm_user_restores_from_private_files_and_branches_stay_private(rt, base, fork, monkeypatch):
    """Snapshot files 0400 in 0700 directories and flat images 0400 in the home's 0700 tmpfs directory: QEMU
    opens them as root before -runas drops to the child's own uid, so children (and branches of them) work."""
    from forkd.core.requests import Branch

    monkeypatch.setenv("FORKD_VMM_RUNAS", "per-child")
    (child,) = fork(1)
    uid = int(child.runas.split(":")[0])
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in open(f"/proc/{child.pid}/status").read()
    assert rt.eval(child.id, "6 * 7")["value"] == "42"
    flat = rt.store.flat_path(base)
    assert flat.stat().st_mode & 0o777 == 0o400 and flat.parent.stat().st_mode & 0o777 == 0o700
    assert_denied(flat)  # on the real tmpfs, where every local user can look
    for name in ("memory.bin", "vmstate"):
        assert (rt.store.dir(base.tag) / name).stat().st_mode & 0o777 == 0o400
    try:
        res = rt.branch(Branch.of(child_id=child.id, tag="sec-branch", mode="full"))
        assert res.snapshot.status == "ready", res.snapshot.error
        d = rt.store.dir("sec-branch")
        assert d.stat().st_mode & 0o777 == 0o700
        for name in ("memory.bin", "vmstate", "snapshot.json"):
            assert (d / name).stat().st_mode & 0o777 == 0o400, name
        (kid,) = fork(1, tag="sec-branch")  # a per-child user restores the branch too
        assert rt.eval(kid.id, "6 * 7")["value"] == "42"
        assert_denied(rt.store.flat_path(res.snapshot))
    finally:
        rt.kill(all_=False, tag="sec-branch")
        if (rt.layout.snapshots / "sec-branch").exists():
            rt.rmi("sec-branch", force=True)


@pytest.mark.parametrize("shared", [False, True])
def test_a_lock_file_that_is_a_symbolic_link_is_never_followed(tmp_path, shared):
    """Locks (forkd.base.locks: the branch lock, a child's wake lock that every request takes shared,
    forkd.sandbox.lockpaths) open their file O_NOFOLLOW: a link planted where one belongs is refused, and the file it
    points at is neither created nor touched."""
    from forkd.base.locks import Flock

    victim = tmp_path / "victim"
    victim.write_bytes(b"root's data")
    (tmp_path / "wake.lock").symlink_to(victim)
    (tmp_path / "dangling.lock").symlink_to(tmp_path / "created-through-the-link")
    for name in ("wake.lock", "dangling.lock"):
        with pytest.raises(OSError):
            Flock(tmp_path / name, shared=shared)
    assert victim.read_bytes() == b"root's data"
    assert not (tmp_path / "created-through-the-link").exists()


def test_the_branch_lock_directory_is_made_private_and_a_planted_link_refused(tmp_path):
    """The home's lock directory (branch locks; the idle sweeper's sleep takes them too) is made 0700 by
    forkd.sandbox.lockpaths.branch_lock; one that is a symbolic link is refused, nothing made through it."""
    from forkd.base.private import UnsafePath
    from forkd.sandbox.lockpaths import LOCK_DIR
    from forkd.sandbox.lockpaths import branch_lock as child_lock_path

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    path = child_lock_path(home, "c0ffee")
    assert path.parent == home / LOCK_DIR and (path.parent.stat().st_mode & 0o777) == 0o700
    other = tmp_path / "other-home"
    other.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (other / LOCK_DIR).symlink_to(elsewhere)
    with pytest.raises(UnsafePath):
        child_lock_path(other, "c0ffee")
    assert list(elsewhere.iterdir()) == []
