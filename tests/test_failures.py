"""Bad input and failures: each gets a clear message and a non-zero exit, leaves no snapshot marked ready
that is not whole, and no stray QEMU process. Failures are real (real QEMU, real guests), not simulated."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from forkd.base.atomic import write_json
from forkd.base.errors import ForkdError
from forkd.core.requests import ParentBuild
from forkd.store.snapshot import Snapshot
from forkd.vmm.agent_client import AgentTimeout
from tests.conftest import BASE_TAG, forkd_cli, qemu_pids


def running_children(rt) -> set[int]:
    return {r.pid for r in rt.children() if r.pid}


def assert_no_stray_qemu(rt, home):
    stray = set(qemu_pids(home)) - running_children(rt)
    assert not stray, f"stray QEMU processes: {stray}"


def test_invalid_tag_is_refused_with_the_rule(home):
    res = forkd_cli("snapshot", "create", "--tag", "Bad Tag")
    assert res.returncode == 2
    assert "invalid tag 'Bad Tag'" in res.stderr and "lowercase" in res.stderr


def test_unknown_tag(home):
    res = forkd_cli("fork", "--tag", "no-such-tag", "--count", "1")
    assert res.returncode == 3
    assert "no snapshot tagged 'no-such-tag'" in res.stderr
    assert forkd_cli("snapshot-info", "no-such-tag").returncode == 3
    assert forkd_cli("rmi", "no-such-tag").returncode == 3


def test_unknown_child(home):
    res = forkd_cli("exec", "cdeadbeef00", "--", "true")
    assert res.returncode == 125 and "no child 'cdeadbeef00'" in res.stderr  # exec: forkd's failures are 125


def test_writing_snapshot_is_not_forkable_and_a_dead_writer_marks_it_failed(rt, home):
    snap = rt.store.begin(Snapshot(tag="half", status="writing", created_at=0, memory_mib=512, vcpus=1,
                                   accel="tcg", image_id="x", kernel_sha256="x", qemu_version="x"))
    res = forkd_cli("fork", "--tag", "half")
    assert res.returncode == 4 and "is writing, not ready" in res.stderr
    assert rt.store.recover() == []  # its writer (this process) is alive: left alone
    # the writer dies (simulated by recording a pid that no longer exists)
    write_json(rt.store.dir("half") / "snapshot.json", snap.with_(writer_pid=2**22 + 1).to_json())
    assert rt.store.recover() == ["half"]
    assert rt.store.get("half").status == "failed"
    assert forkd_cli("fork", "--tag", "half").returncode == 4
    assert forkd_cli("rmi", "half").returncode == 0


@pytest.mark.vm
def test_qemu_failing_to_start_shows_its_stderr(rt, home, base, monkeypatch, tmp_path):
    # the real QEMU, given one more memory backend it cannot create (forkd's own files are private and made by
    # forkd before QEMU starts, so they no longer make it fail)
    wrapper = tmp_path / "qemu"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("qemu-system-x86_64")} "$@" '
                       '-object memory-backend-file,id=bad,size=1M,mem-path=/proc/forkd-noqemu,share=on\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("FORKD_QEMU", str(wrapper))
    res = forkd_cli("snapshot", "create", "--tag", "noqemu")
    assert res.returncode == 1
    assert "start_vmm" in res.stderr or "QEMU exited" in res.stderr
    assert "/proc/forkd-noqemu" in res.stderr  # QEMU's own message, from its log
    assert rt.store.get("noqemu").status == "failed"
    assert_no_stray_qemu(rt, home)
    rt.rmi("noqemu")


@pytest.mark.vm
def test_guest_never_ready_names_the_console_log(rt, home, base):
    with pytest.raises(ForkdError) as exc:
        rt.create_snapshot(ParentBuild.of(tag="slowboot", boot_timeout=0.3))
    msg = str(exc.value)
    assert "console.log" in msg and "did not answer within" in msg, msg
    kept = next(p for p in rt.layout.logs.iterdir() if p.name.startswith("boot-slowboot-"))
    assert str(kept / "console.log") in msg and (kept / "console.log").is_file()  # named where it is kept
    assert rt.store.get("slowboot").status == "failed"
    assert not rt.store.memory_path("slowboot").exists()
    assert_no_stray_qemu(rt, home)
    rt.rmi("slowboot")


@pytest.mark.vm
def test_failing_warmup_leaves_a_failed_snapshot(rt, home, base):
    res = forkd_cli("snapshot", "create", "--tag", "badwarm", "--warm-import", "no_such_module_xyz")
    assert res.returncode == 1 and "No module named 'no_such_module_xyz'" in res.stderr
    assert rt.store.get("badwarm").status == "failed"
    assert_no_stray_qemu(rt, home)
    rt.rmi("badwarm")


@pytest.mark.vm
def test_agent_timeout(rt, fork):
    (c,) = fork(1)
    with rt.agent(c.id) as a, pytest.raises(AgentTimeout):
        a.eval("__import__('time').sleep(3)", timeout=0.5)
    res = forkd_cli("eval", c.id, "__import__('time').sleep(3)", "--timeout", "0.5")
    assert res.returncode == 5 and "did not answer in time" in res.stderr  # the Timeout kind: exit 5
    assert rt.ping(c.id)["pong"] is True  # still serving afterwards


@pytest.mark.vm
def test_corrupted_manifest(rt, home, base):
    d = rt.layout.snapshots / "corrupt"
    d.mkdir()
    (d / "snapshot.json").write_text("{ this is not json")
    res = forkd_cli("fork", "--tag", "corrupt")
    assert res.returncode != 0 and "unreadable" in res.stderr and "snapshot.json" in res.stderr
    listed = json.loads(forkd_cli("snapshots", "-o", "json", check=True).stdout)
    assert any("corrupt" in (x.get("error") or "") for x in listed)
    assert forkd_cli("rmi", "--force", "corrupt").returncode == 0
    assert not d.exists()


@pytest.mark.vm
def test_missing_memory_file(rt, home, base):
    src, dst = rt.store.dir(BASE_TAG), rt.layout.snapshots / "nomem"
    dst.mkdir()
    shutil.copy(src / "vmstate", dst / "vmstate")
    manifest = json.loads((src / "snapshot.json").read_text())
    manifest["tag"] = "nomem"
    (dst / "snapshot.json").write_text(json.dumps(manifest))
    res = forkd_cli("fork", "--tag", "nomem")
    assert res.returncode != 0 and "memory.bin is missing" in res.stderr
    assert_no_stray_qemu(rt, home)
    assert [r for r in rt.children() if r.snapshot == "nomem"] == []
    os.chmod(dst / "vmstate", 0o644)
    rt.rmi("nomem", force=True)


@pytest.mark.vm
def test_rmi_refused_while_children_run(rt, fork):
    (c,) = fork(1)
    res = forkd_cli("rmi", BASE_TAG)
    assert res.returncode == 4 and c.id in res.stderr
    assert rt.store.get(BASE_TAG).status == "ready"
