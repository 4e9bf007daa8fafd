"""Per-child cost settings (issue 18) reach the VMM and the guest: a real child of the session's base snapshot."""

from __future__ import annotations

import pytest

from forkd.base.settings import settings

pytestmark = pytest.mark.vm


def test_child_vmm_runs_with_one_malloc_arena_and_the_tcg_buffer_setting(rt, fork):
    (child,) = fork(1)
    environ = open(f"/proc/{child.pid}/environ", "rb").read().split(b"\0")
    assert f"MALLOC_ARENA_MAX={settings().vmm_malloc_arena_max}".encode() in environ
    argv = open(f"/proc/{child.pid}/cmdline", "rb").read().split(b"\0")
    accel = argv[argv.index(b"-accel") + 1].decode()
    assert accel == (f"tcg,tb-size={settings().tcg_tb_mib}" if child.accel == "tcg" else child.accel)


def test_parent_booted_with_the_quiet_guest_command_line(rt, fork):
    """The base parent booted with FORKD_GUEST_CMDLINE: no soft-lockup watchdog, no periodic vmstat/writeback
    wake-ups; its children run that kernel (they never boot)."""
    (child,) = fork(1)
    res = rt.exec(child.id, ["cat", "/proc/cmdline", "/proc/sys/vm/stat_interval",
                             "/proc/sys/vm/dirty_writeback_centisecs", "/proc/sys/kernel/watchdog"])
    assert res["exit_code"] == 0, res
    cmdline, stat_interval, writeback, watchdog = res["stdout"].split("\n")[:4]
    assert cmdline.split() == settings().guest_cmdline.split()
    assert (stat_interval, writeback, watchdog) == ("3600", "0", "0")
