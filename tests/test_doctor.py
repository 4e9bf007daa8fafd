"""forkd doctor: real host checks against a fresh FORKD_HOME (no mocks, no image build, no VM boots)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.core import doctor, posture
from forkd.core.doctor import Check, run_checks
from forkd.core.runtime import Runtime
from forkd.store.snapshot import Snapshot
from tests.conftest import forkd_cli

STATUSES = {"PASS", "WARN", "FAIL"}
SECURITY = {"security:vmm-uid", "security:seccomp", "security:daemon-socket", "security:store-perms",
            "security:egress", "security:protected-links", "security:unprivileged-uffd", "security:ksm",
            "security:swap"}


@pytest.fixture
def rt(monkeypatch):
    monkeypatch.delenv("FORKD_ACCEL", raising=False)
    monkeypatch.delenv("FORKD_SHM", raising=False)
    d = tempfile.mkdtemp(prefix="fk", dir="/tmp")
    try:
        yield Runtime(Layout(Path(d)))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_fresh_home_without_image(rt):
    seen: list[str] = []
    checks = run_checks(rt, progress=seen.append)
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    assert set(names) == {"qemu", "image", "kernel", "accelerator", "userfaultfd-wp", "vmm-uids", "store-space",
                          "shm-space",
                          "cgroup", "netns", "snapshots", "kvm-device", "leftovers", "disk-tools", "pagemap-scan",
                          "idle-pageout",
                          *SECURITY}
    for c in checks:
        assert c.status in STATUSES, c
        assert c.detail and "\n" not in c.detail, c
        if c.status != "PASS":
            assert c.fix and "\n" not in c.fix, c
    got = by_name(checks)
    assert got["image"].status == "FAIL" and "forkd image build" in got["image"].fix
    assert got["accelerator"].status == "WARN" and "skipped" in got["accelerator"].detail
    assert got["kernel"].status == "WARN"
    assert got["qemu"].status == "PASS"
    assert got["qemu"].detail.startswith("QEMU ") and "qemu-system-x86_64" in got["qemu"].detail
    assert got["snapshots"].status == "PASS"
    assert got["store-space"].status in STATUSES
    assert "checking qemu" in seen


def test_pagemap_scan_finds_written_pages(rt):
    """What a diff branch needs; this machine runs Linux 6.18, so it must pass (the probe scans two pages of its
    own, one written)."""
    c = doctor.check_pagemap_scan(rt)
    assert c.status == "PASS" and "PAGEMAP_SCAN" in c.detail, c


def test_userfaultfd_write_protect_is_available():
    ok, what = doctor.probe_userfaultfd_wp()
    assert isinstance(ok, bool) and what
    c = doctor.check_userfaultfd()
    assert c.status in {"PASS", "WARN"}
    assert "unprivileged_userfaultfd=" in c.detail
    # this machine runs Linux 6.x as root: the syscall and UFFDIO_API handshake must succeed with WP support
    assert c.status == "PASS", c
    assert "write-protect available" in c.detail


def test_netns_can_be_created_as_root():
    c = doctor.check_netns()
    assert c.status == "PASS", c
    ok, what = doctor.netns_by_fork()
    assert ok, what


def test_image_kernel_and_cached_accelerator(rt):
    """A hand-made image directory (dummy files, no build) and a cached probe result: no VM is booted."""
    image_dir = rt.layout.images / "fake0123"
    image_dir.mkdir()
    (image_dir / "vmlinuz").write_bytes(b"k" * 4096)
    (image_dir / "initrd.img").write_bytes(b"i" * 3 * (1 << 20))
    sha = "ab" * 32
    (image_dir / "image.json").write_text(json.dumps({"id": "fake0123", "kernel_sha256": sha}))
    (rt.layout.images / "default").write_text("fake0123\n")
    rt.layout.accel_cache.write_text(json.dumps({sha: {"accel": "tcg", "reason": "test cache", "probe_seconds": 1}}))
    got = by_name(run_checks(rt))
    assert got["image"].status == "PASS" and "fake0123" in got["image"].detail and "3.0 MiB" in got["image"].detail
    assert got["kernel"].status == "PASS" and sha[:12] in got["kernel"].detail
    acc = got["accelerator"]
    assert acc.status == "PASS" and acc.detail.startswith("tcg") and "software emulation" in acc.detail
    assert "(cached)" in acc.detail and "test cache" in acc.detail


def test_snapshot_problems_are_warnings(rt):
    snap = rt.store.begin(Snapshot(tag="broken", status="writing", created_at=time.time(), memory_mib=256, vcpus=1,
                                   accel="tcg", image_id="x", kernel_sha256="y", qemu_version="7.2"))
    c = doctor.check_snapshots(rt)
    assert c.status == "WARN" and "broken (writing)" in c.detail and "forkd snapshot rm" in c.fix
    rt.store.fail(snap, "boom")
    c = doctor.check_snapshots(rt)
    assert c.status == "WARN" and "1 failed" in c.detail and "forkd snapshot rm" in c.fix and "broken" in c.fix
    bad = rt.layout.snapshots / "mangled"
    bad.mkdir()
    (bad / "snapshot.json").write_text("{not json")
    c = doctor.check_snapshots(rt)
    assert c.status == "WARN" and "mangled" in c.detail and "--force" in c.fix


def test_cgroup_layouts(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert doctor.cgroup_info(v2) == ("v2", [], ["memory", "cpu"], os.access(v2, os.W_OK))
    hybrid = tmp_path / "hybrid"
    (hybrid / "unified").mkdir(parents=True)
    (hybrid / "unified" / "cgroup.controllers").write_text("")
    (hybrid / "memory").mkdir()
    (hybrid / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (hybrid / "cpu").mkdir()
    version, v1c, v2c, usable = doctor.cgroup_info(hybrid)
    assert (version, v1c, v2c) == ("hybrid", ["memory", "cpu"], [])
    assert usable
    empty = tmp_path / "none"
    empty.mkdir()
    c = doctor.check_cgroup(empty)
    assert c.status == "WARN" and c.fix and "v1" in c.detail
    assert doctor.check_cgroup().status in {"PASS", "WARN"}


def test_shm_missing_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("FORKD_SHM", str(tmp_path / "absent"))
    c = doctor.check_shm_space()
    assert c.status == "FAIL" and c.fix


def test_an_exploding_check_becomes_a_fail():
    def boom() -> Check:
        raise RuntimeError("kaboom\nsecond line")

    c = doctor._guard("x", boom)
    assert c.status == "FAIL" and "kaboom" in c.detail and "\n" not in c.detail and c.fix


# -- the security posture ------------------------------------------------------------------------------------------
def test_posture_section_lists_each_item_in_cli_json(rt, monkeypatch):
    """`forkd doctor -o json`: one entry per posture item, each PASS or WARN (never FAIL: posture is advice) with a
    one-line detail and, when WARN, a one-line fix."""
    monkeypatch.setenv("FORKD_HOME", str(rt.layout.home))
    monkeypatch.setenv("FORKD_NO_DAEMON", "1")
    res = forkd_cli("doctor", "-o", "json")
    got = {c["name"]: c for c in json.loads(res.stdout)}
    assert SECURITY <= set(got), sorted(got)
    for name in SECURITY:
        c = got[name]
        assert c["status"] in {"PASS", "WARN"} and c["detail"] and "\n" not in c["detail"], c
        assert (c["fix"] is None) == (c["status"] == "PASS") and "\n" not in (c["fix"] or ""), c
    assert "FORKD_VMM_RUNAS=" in got["security:vmm-uid"]["detail"]
    assert "vm.unprivileged_userfaultfd=" in got["security:unprivileged-uffd"]["detail"]
    assert "fs.protected_symlinks=" in got["security:protected-links"]["detail"]


def test_ksm_posture_names_the_switch(rt, monkeypatch):
    monkeypatch.delenv("FORKD_VMM_KSM", raising=False)
    c = posture.check_ksm(rt)
    assert c.status == "PASS" and "never merged" in c.detail and "FORKD_VMM_KSM off" in c.detail
    monkeypatch.setenv("FORKD_VMM_KSM", "1")
    c = posture.check_ksm(rt)
    assert c.status == "WARN" and "FORKD_VMM_KSM" in (c.fix or "")


def test_vmm_uid_mode(rt, monkeypatch):
    monkeypatch.delenv("FORKD_VMM_RUNAS", raising=False)
    c = posture.check_vmm_uid(rt)
    assert c.status == "PASS" and "FORKD_VMM_RUNAS=per-child" in c.detail and "0 running VMMs" in c.detail
    monkeypatch.setenv("FORKD_VMM_RUNAS", "root")
    c = posture.check_vmm_uid(rt)
    assert c.status == "WARN" and "host root" in c.detail and "FORKD_VMM_RUNAS" in c.fix


def test_seccomp_probe_runs_qemu_under_the_filter(rt):
    c = posture.check_seccomp(rt)
    assert c.status == "PASS", c
    assert "spawn=deny" in c.detail


def test_store_permissions(rt):
    home = rt.layout.home
    snap = rt.layout.snapshots / "s1"
    snap.mkdir(parents=True)
    for d in (home, rt.layout.snapshots, snap, *(p for p in home.iterdir() if p.is_dir())):
        d.chmod(0o700)
    c = posture.check_store_permissions(rt)
    assert c.status == "PASS", c
    snap.chmod(0o755)
    c = posture.check_store_permissions(rt)
    assert c.status == "WARN" and f"{snap} (0755)" in c.detail and "go-rwx" in c.fix
    snap.chmod(0o700)
    home.chmod(0o750)
    c = posture.check_store_permissions(rt)
    assert c.status == "WARN" and f"{home} (0750)" in c.detail


def test_daemon_socket_mode(rt):
    sock_path = rt.layout.daemon_socket
    assert posture.check_daemon_socket(rt).status == "PASS"  # no daemon: nothing to reach
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock_path))
        sock_path.chmod(0o666)
        rt.layout.home.chmod(0o755)
        c = posture.check_daemon_socket(rt)
        assert c.status == "WARN" and "0666" in c.detail and "other local users" in c.detail and c.fix
        rt.layout.home.chmod(0o700)  # a private directory is enough
        c = posture.check_daemon_socket(rt)
        assert c.status == "PASS" and "private" in c.detail
        rt.layout.home.chmod(0o755)
        sock_path.chmod(0o600)  # and so is a private socket
        assert posture.check_daemon_socket(rt).status == "PASS"
    finally:
        s.close()


EGRESS_PROBE = """
import json, subprocess, sys
from forkd.core import doctor, posture
from forkd.sandbox import netns
nft = lambda rules: subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
out = [posture.check_egress()]
nft("table ip forkd_host { chain legacy_forward { type filter hook forward priority 0; policy accept; }; }")
out.append(posture.check_egress())
nft("delete table ip forkd_host")
netns.ensure_host()
out.append(posture.check_egress())
print(json.dumps([[c.status, c.detail, c.fix] for c in out]))
"""


def test_egress_table_detection_in_a_private_netns():
    """In a network namespace of the test's own (nftables tables, links and sysctls are per namespace): no forkd
    table, an older forkd's permissive table, then the host table forkd itself installs (netns.ensure_host)."""
    res = subprocess.run(["unshare", "--net", sys.executable, "-c", EGRESS_PROBE], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    none, legacy, installed = json.loads(res.stdout)
    assert none[0] == "WARN" and "not loaded" in none[1] and none[2]
    assert legacy[0] == "WARN" and "permissive" in legacy[1] and "nft delete table ip forkd_host" in legacy[2]
    assert installed[0] == "PASS" and "default deny" in installed[1]


def test_protected_links_and_unprivileged_uffd_follow_the_sysctls(monkeypatch):
    c = posture.check_protected_links()
    symlinks = Path("/proc/sys/fs/protected_symlinks").read_text().strip()
    assert f"fs.protected_symlinks={symlinks}" in c.detail
    assert (c.status == "WARN") == ("=0" in c.detail)
    if c.status == "WARN":
        assert "sysctl -w fs.protected_" in c.fix
    monkeypatch.delenv("FORKD_VMM_RUNAS", raising=False)
    uffd = Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip()
    c = posture.check_unprivileged_uffd()
    assert c.status == ("WARN" if uffd == "0" else "PASS"), c
    if uffd == "0":
        assert "live branch fails" in c.detail and "vm.unprivileged_userfaultfd=1" in c.fix
    monkeypatch.setenv("FORKD_VMM_RUNAS", "root")
    assert posture.check_unprivileged_uffd().status == "PASS"
