"""Issue 18: idle children cost less. A child idle FORKD_IDLE_PAGEOUT_SECS (default 60 s) has its VMM's anonymous
memory (TCG's translation buffer, QEMU's heap) paged out to the host's swap, zram only by default (forkd.core.idle,
forkd.vmm.pageout); it answers its next request unchanged. Real VMs and a real swap: a zram device this module makes
swap for itself and puts back (the host's own swap, if it has one, is used as it is)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from forkd.base.settings import settings
from forkd.core.idle import CLK_TCK, IdleReclaimer, Watch
from forkd.core.posture import check_swap
from forkd.sandbox.supervisor import attached
from forkd.sandbox.wake import wake
from forkd.sdk import Controller, Sandbox
from forkd.vmm.pageout import not_in_ram, page_out, swap_devices, zram_backing
from tests.test_api import start_api_daemon, stop_api_daemon

MIB = 1024


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _settle(rec, limit: float = 60.0) -> None:
    """Wait until the child's VMM is idle (at most one clock tick of CPU in 1 s), as the sweeper would see it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        t0 = _ticks(rec.pid)
        time.sleep(1.0)
        if _ticks(rec.pid) - t0 <= 1:
            return
    raise AssertionError(f"child {rec.id} never went idle within {limit:.0f} s")


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.parametrize("ticks_moved,seconds,idle_secs,was_paged,expect_page,expect_paged_after", [
    (0, 2.0, 1.0, False, True, False),  # idle since the first look, long enough: page out
    (0, 0.5, 1.0, False, False, False),  # idle, not long enough yet
    (0, 2.0, 1.0, True, False, True),  # already paged this idle stretch: not again
    (1, 2.0, 1.0, False, True, False),  # one tick of noise in 2 s (0.5 % of a core) is still idle
    (int(CLK_TCK), 2.0, 1.0, True, False, False),  # it ran (50 % of a core): a new stretch, nothing paged yet
])
def test_idleness_is_decided_from_cpu_time(ticks_moved, seconds, idle_secs, was_paged, expect_page,
                                           expect_paged_after):
    w = Watch(started=7, ticks=100, at=0.0, idle_since=0.0, paged=was_paged)
    assert w.observe(7, 100 + ticks_moved, seconds, idle_secs) is expect_page
    assert w.paged is expect_paged_after


@pytest.mark.parametrize("wakes_now,expect_paged_after", [
    (2, True),  # no page-in since the last look: still paged out, not again
    (3, False),  # a request's page-in read its memory back (it may have cost the VMM no CPU): a new idle stretch
])
def test_a_page_in_on_request_starts_a_new_idle_stretch(wakes_now, expect_paged_after):
    w = Watch(started=7, ticks=100, at=0.0, idle_since=0.0, paged=True, wakes=2)
    assert w.observe(7, 100, 2.0, 1.0, wakes_now) is False  # never paged out again at once
    assert w.paged is expect_paged_after
    assert w.observe(7, 100, 3.5, 1.0, wakes_now) is (not expect_paged_after)  # idle 1.5 s since: paged out again


def test_one_page_in_per_vmm_at_a_time():
    """forkd.sandbox.wake: while one thread pages a VMM in, another is refused."""
    from forkd.sandbox import wake as wake_mod

    pid = 2**22 + 12345  # no such process: only the bookkeeping runs
    first = threading.Thread(target=lambda: None)
    assert wake_mod._claim(pid, 1, first) is True
    try:
        assert wake_mod._claim(pid, 1, threading.current_thread()) is False
    finally:
        wake_mod._running.pop(pid, None)
    assert wake_mod._claim(pid, 1, first) is True  # free again
    wake_mod._running.pop(pid, None)


def test_another_process_under_the_same_child_starts_over():
    w = Watch(started=7, ticks=100, at=0.0, idle_since=0.0, paged=True)
    assert w.observe(8, 5, 10.0, 1.0) is False  # a new VMM: never paged on its first look
    assert (w.started, w.ticks, w.idle_since, w.paged) == (8, 5, 10.0, False)
    assert w.observe(8, 5, 11.5, 1.0) is True


@pytest.mark.parametrize("devices,backing,not_ram", [
    ([], {}, []),
    (["/dev/zram0"], {"/dev/zram0": "none"}, []),
    (["/dev/zram0", "/dev/zram1"], {"/dev/zram0": "none", "/dev/zram1": "none"}, []),
    (["/dev/zram0"], {"/dev/zram0": "/dev/sdb1"}, ["/dev/zram0"]),  # zram writing back to a disk is a disk
    (["/dev/zram0"], {"/dev/zram0": "unknown"}, ["/dev/zram0"]),  # an unreadable backing_dev counts as one
    (["/dev/sda2"], {}, ["/dev/sda2"]),
    (["/swapfile", "/dev/zram0"], {"/dev/zram0": "none"}, ["/swapfile"]),
    (["/dev/loop3"], {}, ["/dev/loop3"]),
    (["/var/zram0"], {"/var/zram0": "none"}, ["/var/zram0"]),  # a file named like zram is a file
])
def test_only_zram_without_writeback_counts_as_memory(devices, backing, not_ram):
    assert not_in_ram(devices, backing=lambda d: backing.get(d, "none")) == not_ram


def test_the_zram_this_module_uses_has_no_backing_device(swap):
    """The real sysfs read: a zram made without a backing device says so (`none`)."""
    for dev in (d for d in swap if d.startswith("/dev/zram")):
        assert zram_backing(dev) == "none" and not_in_ram([dev]) == []


def test_by_default_idle_children_are_paged_out_to_zram_only(swap):
    """SECURITY.md section 9: by default an idle child is paged out after 60 s when the host's swap is zram (this
    module's swap is zram only: tests/swap.py), and doctor says so; the disk case is the next test."""
    assert settings().idle_pageout_secs == 60 and settings().idle_pageout_disk is False
    assert not_in_ram(swap_devices()) == []
    idle = IdleReclaimer(settings().idle_pageout_secs)
    assert idle.swap_allowed() is True and idle.why_not is None
    check = check_swap()
    assert check.status == "PASS" and "after 60 s to compressed RAM" in check.detail, check


@pytest.fixture
def disk_swap():
    """A swap that is not zram, for one test: a loop device over a file (real swap on a block device that is not
    RAM-compressed; removed afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add a swap device")
    backing = Path(tempfile.mkdtemp(prefix="fkswap", dir="/var/tmp")) / "swap.img"
    backing.write_bytes(b"")
    os.truncate(backing, 64 * MIB * 1024)
    made = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(backing.parent)
        pytest.skip(f"no loop device: {made.stderr.strip()}")
    dev = made.stdout.strip()
    try:
        subprocess.run(["mkswap", dev], check=True, capture_output=True)
        subprocess.run(["swapon", "--priority", "-10", dev], check=True, capture_output=True)
        yield dev
    finally:
        subprocess.run(["swapoff", dev], capture_output=True)
        subprocess.run(["losetup", "--detach", dev], capture_output=True)
        shutil.rmtree(backing.parent, ignore_errors=True)


@pytest.mark.vm
def test_a_swap_that_is_not_zram_pages_nothing_out_unless_allowed(rt, fork, swap, disk_swap, monkeypatch):
    """With a loop-device swap active beside zram, an idle child is not paged out (its VMM keeps its memory,
    doctor says why); FORKD_IDLE_PAGEOUT_DISK=1 lets the same reclaimer page it out, and doctor warns."""
    (rec,) = fork(1)
    _settle(rec)
    idle = IdleReclaimer(1.0)
    for _ in range(3):
        assert idle.tick(rt) == {}
        time.sleep(0.6)
    assert _status_kib(rec.pid, "VmSwap") < MIB
    assert disk_swap in (idle.why_not or "") and "FORKD_IDLE_PAGEOUT_DISK" in idle.why_not
    check = check_swap()
    assert check.status == "PASS" and disk_swap in check.detail and "not zram" in check.detail, check
    monkeypatch.setenv("FORKD_IDLE_PAGEOUT_DISK", "1")
    assert check_swap().status == "WARN" and "reaches a disk" in check_swap().detail
    paged: dict = {}
    for _ in range(4):
        paged.update(idle.tick(rt))
        if paged:
            break
        time.sleep(0.6)
    assert list(paged) == [rec.id] and paged[rec.id].moved_kib >= 4 * MIB, paged
    assert idle.why_not is None


@pytest.mark.vm
def test_an_idle_child_is_paged_out_and_answers_unchanged(rt, fork, swap, awake):
    """The idle child's VMM gives most of its private memory to swap (its own heap and code buffer, and the guest
    pages it copied from the snapshot); a busy sibling keeps its own; the paged-out
    child then answers with its state intact (a global from before, a file from before), and is not paged out
    again until it has been idle once more. Page-out alone (`awake`): sleep is the test after next."""
    idle_rec, busy_rec = fork(2)
    assert rt.exec_code(idle_rec.id, "KEPT = 'before the page-out'")["error"] is None
    assert rt.exec(idle_rec.id, ["sh", "-c", "echo on-disk > /root/kept.txt"])["exit_code"] == 0
    assert rt.exec_code(busy_rec.id, "import threading\n"
                              "def _spin():\n    while True:\n        sum(range(10000))\n"
                              "threading.Thread(target=_spin, daemon=True).start()")["error"] is None
    _settle(idle_rec)
    before = _status_kib(idle_rec.pid, "RssAnon")
    guest_before = rt.memory(idle_rec.id)["guest_private_kib"]  # guest pages it copied from the snapshot
    reclaimer = IdleReclaimer(idle_secs=1.0)
    assert reclaimer.tick(rt) == {}  # first look
    time.sleep(1.5)
    reclaimer.budget_s = 0.0  # a tick out of time pages nothing out ...
    assert reclaimer.tick(rt) == {}
    reclaimer.budget_s = 0.5  # ... and the idle child is still due on the next one
    paged = reclaimer.tick(rt)
    assert list(paged) == [idle_rec.id], paged  # the busy one ran all along
    assert rt.child(idle_rec.id).residency == "paged" and rt.child(busy_rec.id).residency == "awake"
    assert paged[idle_rec.id].moved_kib >= 4 * MIB, paged
    assert _status_kib(idle_rec.pid, "VmSwap") >= 4 * MIB
    assert _status_kib(idle_rec.pid, "RssAnon") <= before - 4 * MIB
    assert _status_kib(busy_rec.pid, "VmSwap") < MIB
    assert guest_before > MIB and rt.memory(idle_rec.id)["guest_private_kib"] < guest_before / 2
    assert rt.eval(idle_rec.id, "KEPT")["value"] == repr("before the page-out")
    run = rt.exec(idle_rec.id, ["cat", "/root/kept.txt"])
    assert (run["exit_code"], run["stdout"].strip()) == (0, "on-disk")
    assert reclaimer.tick(rt) == {}  # it ran: a new idle stretch starts, not paged again at once
    woke = rt.child(idle_rec.id)
    assert woke.residency == "awake" and woke.wakes >= 1, woke  # its first request paged it back in


@pytest.mark.vm
def test_the_daemon_pages_out_an_idle_sandbox(home, rt, base, swap, tmp_path):
    """FORKD_IDLE_PAGEOUT_SECS=1 on a real daemon: its sweeper pages an idle sandbox out, and the sandbox answers."""
    old = {k: os.environ.get(k) for k in ("FORKD_IDLE_PAGEOUT_SECS", "FORKD_SWEEP_INTERVAL")}
    os.environ.update({"FORKD_IDLE_PAGEOUT_SECS": "1", "FORKD_SWEEP_INTERVAL": "0.5"})
    try:
        d = start_api_daemon(home, tmp_path)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        sb = Sandbox.create(template=base.tag, controller=Controller(socket=home / "forkd.sock"))
        pid = rt.registry.get(sb.id).pid
        deadline = time.monotonic() + 120
        while _status_kib(pid, "VmSwap") < 4 * MIB:
            assert time.monotonic() < deadline, "the daemon never paged the idle sandbox out:\n" + d.log.read_text()
            time.sleep(0.5)
        assert sb.eval("6 * 7").result == "42"
        sb.kill()
    finally:
        stop_api_daemon(d)



def _paged_out(rt, rec) -> int:
    """Page the child out as the sweeper would (once it is idle); its VMM's KiB in swap after."""
    _settle(rec)
    page_out(rec.pid, rec.started)
    swapped = _status_kib(rec.pid, "VmSwap")
    assert swapped >= 8 * MIB, swapped
    return swapped


@pytest.mark.vm
def test_a_request_brings_a_paged_out_child_back_at_once(rt, fork, swap, monkeypatch):
    """forkd.sandbox.wake: a request to a paged-out child starts paging its anonymous memory back in on another
    thread (one at a time per VMM), so it leaves swap whole instead of as the request happens to touch it; with
    FORKD_PAGE_IN_ON_REQUEST=0 only what the request touched comes back. What stays in swap either way is the
    guest pages it had copied (a file mapping, which MADV_WILLNEED does not swap in)."""
    woken, asleep = fork(2)
    for rec in (woken, asleep):
        assert rt.exec(rec.id, ["true"])["exit_code"] == 0  # a first exec: ~9 MiB more TCG code to page out
    monkeypatch.setenv("FORKD_PAGE_IN_SCOPE", "all")
    monkeypatch.setenv("FORKD_PAGE_IN_ON_REQUEST", "0")
    off_before = _paged_out(rt, asleep)
    assert wake(asleep.pid, asleep.started) is None  # off: nothing starts
    assert rt.eval(asleep.id, "6 * 7")["value"] == "42"
    off_after = _status_kib(asleep.pid, "VmSwap")
    monkeypatch.setenv("FORKD_PAGE_IN_ON_REQUEST", "1")
    on_before = _paged_out(rt, woken)
    thread = wake(woken.pid, woken.started)
    assert thread is not None
    thread.join(30)
    assert rt.eval(woken.id, "6 * 7")["value"] == "42"
    on_after = _status_kib(woken.pid, "VmSwap")
    guest = rt.memory(woken.id)["guest_private_kib"]
    assert off_after > off_before / 2, (off_before, off_after)  # the request alone brought back little
    assert on_after < on_before / 3, (on_before, on_after)  # the page-in brought back most of it
    assert wake(woken.pid, woken.started) is None  # what is left in swap is under MIN_SWAPPED_KIB or file-backed
    print(f"in swap before/after a request: off {off_before}/{off_after} KiB, on {on_before}/{on_after} KiB "
          f"(guest private resident {guest} KiB)")


def _swap_by_kind(pid: int) -> dict[str, int]:
    """KiB in swap of the VMM's executable private mappings (TCG's translation buffer) and of its other anonymous
    ones (heap, thread arenas), from /proc/PID/smaps."""
    out, kind = {"code": 0, "data": 0}, None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:  # a mapping's first line: range perms offset dev inode [name]
            name = head[5] if len(head) > 5 else ""
            kind = "code" if head[1][2] == "x" and not name else "data" if name in ("", "[heap]") else None
        elif kind and line.startswith("Swap:"):
            out[kind] += int(head[1])
    return out


@pytest.mark.vm
def test_a_request_pages_in_the_translation_buffer_only_by_default(rt, fork, swap, monkeypatch):
    """FORKD_PAGE_IN_SCOPE=code (the default): a request's page-in reads TCG's translation buffer back whole and
    leaves QEMU's other anonymous memory in swap, to fault back only where the request touches it."""
    monkeypatch.delenv("FORKD_PAGE_IN_SCOPE", raising=False)
    assert settings().page_in_scope == "code"
    (rec,) = fork(1)
    assert rt.exec(rec.id, ["true"])["exit_code"] == 0
    _paged_out(rt, rec)
    before = _swap_by_kind(rec.pid)
    assert before["code"] >= 4 * MIB and before["data"] >= 2 * MIB, before
    thread = wake(rec.pid, rec.started)
    assert thread is not None
    thread.join(30)
    after = _swap_by_kind(rec.pid)
    assert after["code"] < before["code"] / 10, (before, after)  # the code came back
    assert after["data"] > before["data"] / 2, (before, after)  # the rest did not (the idle guest touches little)
    assert rt.exec(rec.id, ["true"])["exit_code"] == 0


@pytest.mark.vm
def test_a_request_to_a_paged_out_child_pages_it_in_through_the_runtime(rt, fork, swap, monkeypatch):
    """The same through the one front door: `rt.exec` on a paged-out child (FORKD_PAGE_IN_ON_REQUEST on, the
    default) leaves little of its translation buffer in swap shortly after."""
    monkeypatch.delenv("FORKD_PAGE_IN_ON_REQUEST", raising=False)
    monkeypatch.delenv("FORKD_PAGE_IN_SCOPE", raising=False)
    assert settings().page_in_on_request
    (rec,) = fork(1)
    _paged_out(rt, rec)
    before = _swap_by_kind(rec.pid)["code"]
    assert before >= 2 * MIB, before
    assert rt.exec(rec.id, ["true"])["exit_code"] == 0
    deadline = time.monotonic() + 30
    while (left := _swap_by_kind(rec.pid)["code"]) >= before / 10:
        assert time.monotonic() < deadline, f"still {left} of {before} KiB of code in swap"
        time.sleep(0.2)


def _asleep(rt, rec) -> bool:
    return rt.child(rec.id).residency == "asleep"


def _run_state(rt, rec) -> str:
    with attached(rt.driver, rec) as vm:
        return rt.driver.run_state(vm)


@pytest.mark.vm
def test_idle_child_sleeps_and_its_next_request_wakes_it_with_the_right_clock(rt, fork, swap, monkeypatch):
    """FORKD_IDLE_SLEEP (on by default; forkd.sandbox.child): the sweeper stops an idle child's vCPUs before its
    page-out; the stopped VMM uses no CPU; the next request through the one door resumes it and sets the guest's
    clock, which stood still while it slept."""
    monkeypatch.delenv("FORKD_IDLE_SLEEP", raising=False)
    assert settings().idle_sleep is True
    (rec,) = fork(1)
    _settle(rec)
    reclaimer, deadline = IdleReclaimer(1.0), time.monotonic() + 60
    while not _asleep(rt, rec):
        assert time.monotonic() < deadline, "the sweeper never put the idle child to sleep"
        reclaimer.tick(rt)
        time.sleep(0.5)
    assert _run_state(rt, rec) == "paused"
    t0 = _ticks(rec.pid)
    time.sleep(3.0)  # the guest's clock stands still meanwhile
    assert _ticks(rec.pid) - t0 <= 1, "a sleeping child's VMM used CPU"
    res = rt.eval(rec.id, "__import__('time').time()")
    assert abs(float(res["value"]) - time.time()) < 1.0, res  # set on wake, not 3 s behind
    assert not _asleep(rt, rec) and _run_state(rt, rec) == "running"
    assert rt.child(rec.id).wakes >= 1
    assert rt.exec(rec.id, ["true"])["exit_code"] == 0


@pytest.mark.vm
def test_a_child_is_not_put_to_sleep_while_a_request_holds_it(rt, fork, monkeypatch):
    """The sweeper gets a child's wake lock only when no request holds it (shared, for the request's length): a
    request in flight is never frozen under it."""
    (rec,) = fork(1)
    with rt.agent(rec.id) as agent:
        assert rt.handles.of(rec).sleep() is False
        assert agent.ping()["child_id"] == rec.id
    assert not _asleep(rt, rec) and _run_state(rt, rec) == "running"
    assert rt.handles.of(rec).sleep() is True  # nothing in flight now
    assert _asleep(rt, rec) and _run_state(rt, rec) == "paused"
    assert rt.eval(rec.id, "6 * 7")["value"] == "42"  # and the next request wakes it
    assert not _asleep(rt, rec) and rt.child(rec.id).wakes == 1
