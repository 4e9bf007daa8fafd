"""The checks of the full-home fault (tests/faults/inject.py) can fail: each broken promise is named, made here
on a real home directory (no VM, no mount): an operation that succeeds, or fails for another reason, on a full
home; a temporary left in tmp/; an audit log edited; a half-made snapshot left `ready`."""

from __future__ import annotations

import errno
import os
import time

import pytest

from forkd.base.errors import Unavailable
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.core.audit import AuditLog
from forkd.core.runtime import Runtime
from forkd.store.snapshot import Snapshot
from tests.faults import inject


@pytest.fixture
def rt(tmp_path):
    return Runtime(Layout(tmp_path / "home"))


def _nospace():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/h/snapshots/x/mem")


def _busy():
    raise Unavailable("the daemon is busy")


def test_an_operation_on_a_full_home_must_fail_naming_the_lack_of_space():
    out = inject.Outcome("home_full")
    inject._refused_for_space(out, "a branch", _nospace)
    assert out.held
    inject._refused_for_space(out, "a layer build", lambda: {"status": "ready"})
    inject._refused_for_space(out, "an unpack", _busy)
    assert out.broken == ["a layer build succeeded on a full $FORKD_HOME",
                          "an unpack on a full $FORKD_HOME failed without naming the lack of space: "
                          "the daemon is busy"]


def test_a_temporary_left_in_tmp_breaks_the_promise(rt):
    out = inject.Outcome("home_full")
    inject._whole(out, rt, "with the home full")
    assert out.held, out.broken
    (rt.layout.tmp / owned_name("unpack")).mkdir()
    inject._whole(out, rt, "with the home full")
    assert len(out.broken) == 1 and "with the home full: temporaries left behind: ['unpack-" in out.broken[0]


def test_an_audit_log_whose_chain_is_broken_breaks_the_promise(rt):
    log = AuditLog(rt.layout.home)
    for i in range(3):
        log.append("test", "branch", f"t{i}", "ok", 1.0)
    out = inject.Outcome("home_full")
    inject._whole(out, rt, "once space is freed")
    assert out.held, out.broken
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(lines[0] + lines[1].replace(b"t1", b"t9") + lines[2])
    inject._whole(out, rt, "once space is freed")
    assert len(out.broken) == 1 and "the audit log does not verify" in out.broken[0], out.broken


def _snapshot(rt, tag: str) -> Snapshot:
    return rt.store.begin(Snapshot(tag=tag, status="writing", created_at=time.time(), memory_mib=256, vcpus=1,
                                   accel="tcg", image_id="x", kernel_sha256="y", qemu_version="7.2"))


def test_a_refused_operation_whose_snapshot_is_ready_or_half_made_breaks_the_promise(rt):
    out = inject.Outcome("home_full")
    rt.store.fail(_snapshot(rt, "soak-full-br-1"), "No space left on device")
    inject._not_ready(out, rt, "soak-full-br-1", "the live branch")
    inject._not_ready(out, rt, "never-made", "the layer build")
    inject._whole(out, rt, "with the home full")
    assert out.held, out.broken  # failed, or never made: as promised
    rt.store.commit(_snapshot(rt, "soak-full-layer"))  # "ready" with none of its files
    inject._not_ready(out, rt, "soak-full-layer", "the layer build")
    inject._whole(out, rt, "with the home full")
    assert out.broken[0] == "the layer build failed on a full $FORKD_HOME yet snapshot soak-full-layer is ready"
    assert len(out.broken) == 2 and "snapshot soak-full-layer is ready but" in out.broken[1], out.broken
