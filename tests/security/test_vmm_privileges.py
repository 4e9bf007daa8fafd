"""VMM privileges (issue 14, finding 7), with real QEMU: a VMM is the piece of forkd a guest attacks first (TCG and
the device models parse everything the guest does), so by default every VMM (children, parent boots, layer builds,
branch conversions) drops to a uid of its own with no capabilities once its files are open, under QEMU's seccomp
filter. The attacker here is a compromised VMM: what it may open is checked by asking the VMM itself to open files
(QMP `blockdev-add` of a raw file, which QEMU opens with its own credentials), what it may signal with its uid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.settings import settings
from forkd.core.branch import branch, wait_background
from forkd.core.requests import Branch, Spawn
from forkd.vmm.driver import RunFiles
from forkd.vmm.qemu_cmdline import empty_root
from tests.conftest import BASE_TAG

SETPRIV = "/usr/bin/setpriv"
BUILD_UID_BASE = (1 << 28) + (1 << 28)  # the default range's upper half: build VMMs (forkd.base.idrange)


@pytest.fixture(autouse=True)
def default_runas(monkeypatch):
    """The defaults under test: nothing in the environment says how VMMs run."""
    monkeypatch.delenv("FORKD_VMM_RUNAS", raising=False)


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def assert_unprivileged(pid: int) -> int:
    """The VMM `pid` runs as one non-zero uid/gid, no supplementary root group, no capability, seccomp filter mode;
    returns its uid."""
    st = proc_status(pid)
    uids, gids = st["Uid"].split(), st["Gid"].split()
    assert len(set(uids)) == 1 and uids[0] != "0", st["Uid"]
    assert len(set(gids)) == 1 and gids[0] != "0", st["Gid"]
    assert "0" not in st["Groups"].split(), st["Groups"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(st[cap], 16) == 0, f"{cap}: {st[cap]}"
    assert st["Seccomp"].strip() == "2", st["Seccomp"]  # QEMU's -sandbox filter
    assert st["NoNewPrivs"].strip() == "1"  # and no exec could raise it again (spawn=deny forbids exec anyway)
    return int(uids[0])


def vmm_opens(rt, child_dir: str, pid: int, started: int, path: Path) -> str | None:
    """Ask the VMM to open `path` read-only (QMP blockdev-add, a raw file node); None if it could, else QEMU's
    error. The node is removed again either way."""
    vm = rt.driver.attach(RunFiles(Path(child_dir)), pid, started)
    try:
        rt.driver.connect(vm, timeout=10)
        node = "probe" + os.urandom(3).hex()
        try:
            vm.qmp.execute("blockdev-add", {"driver": "raw", "node-name": node, "read-only": True,
                                            "file": {"driver": "file", "filename": str(path)}})
        except ForkdError as exc:
            return exc.message
        vm.qmp.execute("blockdev-del", {"node-name": node})
        return None
    finally:
        rt.driver.release(vm)


@pytest.fixture
def secret():
    """A root-only host file (0600 in a 0700 directory): what no VMM may read."""
    d = Path(tempfile.mkdtemp(prefix="fksec", dir="/tmp"))
    f = d / "secret"
    f.write_bytes(b"root-only\n" * 100)
    f.chmod(0o600)
    d.chmod(0o755)  # the directory is searchable: only the file's own mode protects it
    yield f
    f.unlink()
    d.rmdir()


@pytest.mark.vm
def test_child_vmm_runs_as_its_own_uid_without_capabilities(rt, fork):
    a, b = fork(2)
    ua, ub = assert_unprivileged(a.pid), assert_unprivileged(b.pid)
    assert a.runas == f"{ua}:{ua}" and b.runas == f"{ub}:{ub}"  # recorded: gc and doctor see it
    assert ua != ub  # one uid per child
    assert rt.eval(a.id, "6 * 7")["value"] == "42" and rt.eval(b.id, "1 + 1")["value"] == "2"


@pytest.mark.vm
def test_child_vmm_cannot_open_root_files_or_a_siblings_run_dir(rt, fork, secret):
    """A child's VMM is chrooted into an empty directory once it dropped root (the jailer's private view): no host
    path resolves for it, not even a world-readable file; its uid would be refused the rest anyway."""
    a, b = fork(2)
    assert "No such file" in (vmm_opens(rt, a.dir, a.pid, a.started, secret) or "it opened")
    # the sibling's QEMU log, and a world-readable file placed in its run dir
    planted = Path(b.dir) / "planted.txt"
    planted.write_text("readable by all, inside a private directory\n")
    planted.chmod(0o644)
    for f in (Path(b.dir) / "qemu.log", planted, Path("/etc/hostname")):
        assert f.exists()
        assert "No such file" in (vmm_opens(rt, a.dir, a.pid, a.started, f) or "it opened")
    # the probe itself works: its root exists (an empty directory), so the misses above are its view
    assert "No such file" not in (vmm_opens(rt, a.dir, a.pid, a.started, Path("/")) or "it opened")
    assert os.readlink(f"/proc/{a.pid}/root") == str(empty_root())


@pytest.mark.vm
def test_each_vmm_is_pid_1_of_its_own_pid_namespace_with_a_mount_namespace_of_its_own(fork):
    """The jailer's namespaces: besides its network namespace, each child's VMM has a mount namespace and a pid
    namespace of its own (tests/security/test_born_apart.py: slave propagation, the caller unchanged)."""
    a, b = fork(2)
    host = {k: os.readlink(f"/proc/self/ns/{k}") for k in ("mnt", "pid")}
    seen = []
    for c in (a, b):
        ns = {k: os.readlink(f"/proc/{c.pid}/ns/{k}") for k in ("mnt", "pid")}
        assert ns["mnt"] != host["mnt"] and ns["pid"] != host["pid"], ns
        assert proc_status(c.pid)["NSpid"].split() == [str(c.pid), "1"]
        seen.append(ns)
    assert seen[0]["mnt"] != seen[1]["mnt"] and seen[0]["pid"] != seen[1]["pid"]


@pytest.mark.vm
def test_child_vmm_uid_cannot_signal_or_trace_a_sibling(fork):
    a, b = fork(2)
    ua = assert_unprivileged(a.pid)
    # the sibling's VMM, as the first VMM's credentials (setpriv: same uid/gid, no groups, no capabilities)
    res = subprocess.run([SETPRIV, f"--reuid={ua}", f"--regid={ua}", "--clear-groups", "--inh-caps=-all",
                          "--bounding-set=-all", sys.executable, "-c",
                          f"import os\ntry:\n os.kill({b.pid}, 0)\nexcept PermissionError:\n print('EPERM')\n"
                          f"try:\n open('/proc/{b.pid}/mem', 'rb')\nexcept PermissionError:\n print('EACCES')\n"],
                         capture_output=True, text=True, timeout=30)
    assert res.stdout.split() == ["EPERM", "EACCES"], (res.stdout, res.stderr)
    assert os.kill(b.pid, 0) is None  # still alive


@pytest.mark.vm
def test_build_vmms_drop_root_too(rt, base, tmp_path):
    """Parent boots (and, through the same restore without an identity, layer builds) run image code: their VMMs
    drop to a fresh uid of their own too."""
    snap = rt.store.get_ready(BASE_TAG)
    machine = rt.machine_for(snap)
    vm = rt.driver.restore(machine, rt.store.materialize(BASE_TAG), rt.store.vmstate_path(BASE_TAG),
                           RunFiles(tmp_path / "layer"))  # what forkd.core.pipeline.layer does (share=True there)
    try:
        assert assert_unprivileged(vm.pid) >= BUILD_UID_BASE
        assert vm.agent.eval("2 + 2")["value"] == "4"
    finally:
        rt.driver.stop(vm)
    work = tmp_path / "boot"
    work.mkdir()
    mem = Path(tempfile.mkdtemp(prefix="fksecb", dir="/dev/shm")) / "boot.mem"
    try:
        vm = rt.driver.boot(machine, mem, RunFiles(work))
        try:
            assert assert_unprivileged(vm.pid) >= BUILD_UID_BASE
        finally:
            rt.driver.stop(vm)
    finally:
        mem.unlink(missing_ok=True)
        mem.parent.rmdir()


@pytest.mark.vm
@pytest.mark.parametrize("capture", ["pages", "write-protect"])
def test_live_branch_of_a_child_whose_vmm_dropped_root(rt, fork, monkeypatch, capture):
    """By pages, forkd reads the VMM's pages itself: no userfaultfd in the VMM, whatever the sysctl says. By
    write-protect, QEMU needs one: without vm.unprivileged_userfaultfd the branch is refused up front."""
    monkeypatch.setenv("FORKD_BRANCH_LIVE_CAPTURE", capture)
    tag = f"dropped-{capture}"
    (c,) = fork(1)
    assert_unprivileged(c.pid)
    assert rt.exec_code(c.id, f"BRANCHED = {capture!r}")["error"] is None
    allowed = Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip() == "1"
    if capture == "write-protect" and not allowed:  # refused before anything is written, saying how to allow it
        with pytest.raises(Conflict) as info:
            branch(rt, Branch.of(child_id=c.id, tag=tag, mode="live"))
        assert "unprivileged_userfaultfd" in info.value.message and "sysctl" in info.value.hint
        return
    res = branch(rt, Branch.of(child_id=c.id, tag=tag, mode="live"))
    try:
        assert res.snapshot.status == "ready" and res.capture == capture, res.snapshot.error
        (g,) = rt.fork(Spawn.of(tag=tag, n=1))
        try:
            assert_unprivileged(g.pid)
            assert rt.eval(g.id, "BRANCHED")["value"] == repr(capture)
        finally:
            rt.kill([g.id])
        assert rt.eval(c.id, "BRANCHED")["value"] == repr(capture)  # the source kept running
    finally:
        wait_background(rt, 60)
        rt.rmi(tag)


@pytest.mark.vm
def test_root_is_an_explicit_opt_out(rt, fork, monkeypatch):
    monkeypatch.setenv("FORKD_VMM_RUNAS", "root")
    (c,) = fork(1)
    assert c.runas is None and proc_status(c.pid)["Uid"].split()[0] == "0"
    assert "-runas" not in open(f"/proc/{c.pid}/cmdline", "rb").read().decode().split("\0")


def test_runas_setting_values(monkeypatch):
    monkeypatch.delenv("FORKD_VMM_RUNAS", raising=False)
    assert settings().vmm_runas == "per-child" and settings().vmm_runas_per_child
    for old in ("1", "yes", "per-child"):  # the opt-in values of before still mean per-child
        monkeypatch.setenv("FORKD_VMM_RUNAS", old)
        assert settings().vmm_runas == "per-child"
    monkeypatch.setenv("FORKD_VMM_RUNAS", "nobody")
    with pytest.raises(InvalidInput) as info:
        settings()
    assert "FORKD_VMM_RUNAS" in info.value.message


def test_vmm_uid_is_unique_per_child_by_construction():
    from forkd.sandbox.supervisor import runas_identity
    ids = {runas_identity("c" + os.urandom(5).hex()) for _ in range(2000)}
    uids = {int(i.split(":")[0]) for i in ids}
    assert all(1 << 28 <= u < BUILD_UID_BASE for u in uids)  # never root, never a build VMM's range (default range)
    assert len(uids) >= 1990  # 28 random bits per child


def test_disk_backed_vmms_drop_root_too(tmp_path):
    """Every VMM gets an identity of its own, with a disk too (its chain is handed over as descriptors:
    tests/test_disk_rootfs.py shows one running jailed)."""
    from forkd.vmm.driver import Machine
    from forkd.vmm.qemu_cmdline import build_identity, may_drop
    plain = Machine(kernel=tmp_path / "k", initrd=tmp_path / "i", memory_mib=256)
    disk = Machine(kernel=tmp_path / "k", initrd=tmp_path / "i", memory_mib=256, disk=tmp_path / "d.qcow2")
    assert may_drop(plain) and may_drop(disk)
    for m in (plain, disk):
        uid, gid = map(int, build_identity(m).split(":"))
        assert uid == gid and BUILD_UID_BASE <= uid < BUILD_UID_BASE + (1 << 28)


@pytest.mark.vm
@pytest.mark.skipif(not os.access("/dev/kvm", os.R_OK | os.W_OK), reason="the probe runs only where /dev/kvm opens")
def test_the_accelerator_probe_runs_jailed(rt, base):
    """The KVM probe boots the image's kernel too: its QEMU drops to a uid of the build range with QEMU's seccomp
    filter, in an empty network namespace of its own (seen on the live process while the probe runs)."""
    import threading

    from forkd.vmm.accel import probe

    image = rt.image()
    done: list = []
    t = threading.Thread(target=lambda: done.append(probe(settings().qemu, image.kernel, image.initrd, timeout=20)))
    t.start()
    try:
        seen, qemu = None, None
        while not done and seen is None:  # the probe's QEMU appears, opens /dev/kvm, then drops (polled)
            for d in Path("/proc").iterdir():
                try:
                    if d.name.isdigit() and b"forkd.probe" in (d / "cmdline").read_bytes() \
                            and (d / "exe").resolve().name.startswith("qemu-system"):
                        qemu = int(d.name)
                        if proc_status(qemu)["Uid"].split()[0] != "0":
                            seen = qemu
                except OSError:
                    continue
            t.join(0.05)
        if qemu is None:
            pytest.skip("the probe finished before its QEMU could be seen (a KVM guest that booted at once)")
        assert seen is not None, "the probe's QEMU ran as root until it ended"
        assert assert_unprivileged(seen) >= BUILD_UID_BASE
        assert os.stat(f"/proc/{seen}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
    finally:
        if seen is not None and not done:  # seen: the probe need not wait out its timeout on a KVM that hangs
            with contextlib.suppress(ProcessLookupError):
                os.kill(seen, signal.SIGKILL)
        t.join()
    assert done and done[0].accel in ("kvm", "tcg")
