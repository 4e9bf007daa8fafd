"""Idle children cost less: once a running child's VMM has been idle for FORKD_IDLE_PAGEOUT_SECS, its
private memory (TCG's translation buffer, QEMU's heap, the guest pages it copied) is paged out to the host's swap
(forkd.vmm.pageout), and the child is stopped until its next request (FORKD_IDLE_SLEEP, on by default).

After 60 s by default (0 = never), and only to zram: with a zram swap device the pages stay in RAM, compressed; a
swap that is not zram (a disk) is used only with FORKD_IDLE_PAGEOUT_DISK, since guest memory would reach the disk
(SECURITY.md section 9). Without swap nothing is paged out. The daemon never turns swap on: scripts/setup.sh makes a
zram swap sized for the host (scripts/zram.sh), and `forkd doctor` (idle-pageout) says whether the swap these
defaults assume is there.

Idle means: between two looks, the VMM used at most IDLE_CPU_PCT of a core (an idle TCG child uses ~0.05 %). A
child is paged out once per idle stretch: when it runs again (a request, its own work), its pages fault back in and
the clock starts over. The runtime's idle loop (forkd.core.sweeper) calls `IdleReclaimer.tick` every
FORKD_SWEEP_INTERVAL seconds; the decision (`Watch.observe`) is pure and table-tested. With FORKD_IDLE_SLEEP the
child is also stopped before its page-out, until its next request. What is done to a child (sleep, page-out) and
what it is now (its residency and wakes, on its record) is its handle's (forkd.sandbox.child)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from forkd.base.errors import ForkdError
from forkd.base.settings import settings
from forkd.vmm.pageout import PagedOut, not_in_ram, swap_devices

log = logging.getLogger(__name__)
IDLE_CPU_PCT = 1.0  # at most this much of one core between two looks counts as idle
CLK_TCK = os.sysconf("SC_CLK_TCK")
ZRAM_FIX = ("run scripts/setup.sh from a forkd checkout (or scripts/zram.sh up alone): it makes a zram swap sized for "
            "this host, and scripts/setup.sh --undo-zram removes it; by hand: zramctl --find --size 4G (prints "
            "/dev/zramN), then mkswap /dev/zramN && swapon /dev/zramN")
GIB_KIB = 1 << 20


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of every thread of `pid` so far (clock ticks), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


@dataclass
class Watch:
    """One child's idleness: its VMM's identity, its CPU at the last look, since when it has been idle, whether
    this idle stretch was paged out already, and its resident anonymous memory right after that page-out."""

    started: int | None
    ticks: int
    at: float  # when `ticks` was read
    idle_since: float
    paged: bool = False
    wakes: int = 0  # the child's wakes (ChildRecord.wakes) seen so far

    def observe(self, started: int | None, ticks: int, now: float, idle_secs: float, wakes: int = 0) -> bool:
        """Take a new look; True when the child should be paged out now. A request's page-in since the last look
        (`wakes` grew) starts a new idle stretch even if the request cost the VMM little CPU: the page-in read its
        memory back on forkd's thread, so it must be paged out again once idle."""
        if started != self.started:  # another process: start over
            self.started, self.ticks, self.at, self.idle_since, self.paged = started, ticks, now, now, False
            self.wakes = wakes
            return False
        allowed = max(1.0, (now - self.at) * CLK_TCK * IDLE_CPU_PCT / 100.0)
        woken, self.wakes = wakes != self.wakes, wakes
        if ticks - self.ticks > allowed or woken:  # it ran, or its memory was read back: a new idle stretch
            self.idle_since, self.paged = now, False
        self.ticks, self.at = ticks, now
        return not self.paged and now - self.idle_since >= idle_secs


@dataclass
class IdleReclaimer:
    idle_secs: float
    scope: str = "private"  # forkd.vmm.pageout.SCOPES ("anon": bench/density.py's comparison)
    budget_s: float = 0.5  # paging out stops for this tick after this long (the sweeper has lifetimes to enforce)
    clock: Any = time.monotonic
    watches: dict[str, Watch] = field(default_factory=dict)
    why_not: str | None = None  # why nothing is paged out, as last said

    def tick(self, rt: Any) -> dict[str, PagedOut]:
        """Look at every running child once; page out those idle long enough, for at most `budget_s` (the rest
        stay due and are paged out on the next ticks). Returns what was paged out."""
        if self.idle_secs <= 0 or not self.swap_allowed():
            return {}
        now, out, t0 = self.clock(), {}, time.monotonic()
        running = {h.id: h for h in rt.handles.running()}
        for gone in set(self.watches) - set(running):
            del self.watches[gone]
        for cid, child in running.items():
            rec = child.rec
            ticks = cpu_ticks(rec.pid)
            if ticks is None:
                continue
            w = self.watches.get(cid)
            if w is None:
                self.watches[cid] = Watch(rec.started, ticks, now, now, wakes=rec.wakes)
                continue
            due = w.observe(rec.started, ticks, now, self.idle_secs, rec.wakes)
            if due and time.monotonic() - t0 < self.budget_s:
                w.paged = True
                if settings().idle_sleep:  # stopped first: a stopped VM faults nothing back after its page-out
                    _sleep(child)
                try:
                    out[cid] = child.page_out(self.scope)
                except ForkdError as exc:
                    log.warning("idle page-out of %s: %s", cid, exc.message)
        return out

    def swap_allowed(self) -> bool:
        """Whether paging out can go anywhere allowed: some swap, all of it zram unless FORKD_IDLE_PAGEOUT_DISK.
        Says why not once per change (at info: a host without swap is an ordinary host)."""
        devices = swap_devices()
        on_disk = [] if settings().idle_pageout_disk else not_in_ram(devices)
        why = ("the host has no swap (a zram swap device: see `forkd doctor`)" if not devices else
               f"{', '.join(on_disk)} is not zram (or has a backing device): guest memory would reach a disk "
               "(FORKD_IDLE_PAGEOUT_DISK=1 allows it)" if on_disk else None)
        if why and why != self.why_not:
            log.info("idle children are not paged out: %s", why)
        self.why_not = why
        return why is None


def _sleep(child: Any) -> None:
    """FORKD_IDLE_SLEEP: stop the child's vCPUs until its next request (forkd.sandbox.child)."""
    if child.asleep:
        return
    try:
        child.sleep()
    except (ForkdError, OSError) as exc:
        log.warning("idle sleep of %s: %s", child.id, exc)


def pageout_check(secs: float, sleep: bool, devices: list[str], on_disk: list[str], disk_ok: bool, swap_kib: int,
                  mem_kib: int) -> tuple[str, str, str | None]:
    """`forkd doctor`'s idle-pageout check, decided from what forkd.core.doctor.check_idle_pageout read: (PASS or
    WARN, what was found, the fix). Whether the swap the density defaults assume is there: some swap, all zram
    (unless `disk_ok`), at least half the host's memory in size (the compressed pages of a host full of idle
    children)."""
    what = f"idle children are paged out after {secs:g} s" + (" and put to sleep" if sleep else "")
    if secs <= 0:
        return "PASS", "idle page-out is off (FORKD_IDLE_PAGEOUT_SECS=0): idle children keep all their memory", None
    if not devices:
        return ("WARN", "the host has no swap: idle children are never paged out (nor put to sleep) and each keeps "
                "all its memory; forkd's density defaults assume a zram swap", ZRAM_FIX)
    if on_disk and not disk_ok:
        return ("WARN", f"idle children are not paged out: {', '.join(on_disk)} is not zram (or a zram with a "
                "backing device), and guest memory would reach a disk",
                f"swapoff {' '.join(on_disk)} and {ZRAM_FIX}; or FORKD_IDLE_PAGEOUT_DISK=1 (guest memory then "
                "reaches that disk: SECURITY.md section 9)")
    found = f"{', '.join(devices)}, {swap_kib / GIB_KIB:.1f} GiB"
    if swap_kib * 2 < mem_kib:
        return ("WARN", f"{what} to {found}: under half of this host's {mem_kib / GIB_KIB:.1f} GiB of memory, so "
                "page-out stops once it is full", "a larger zram swap: swapoff and zramctl --reset it, then "
                "scripts/zram.sh up (sized for this host)")
    return "PASS", f"{what} to {found}", None

