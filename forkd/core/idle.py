"""Idle children cost less: once a running child's VMM has been idle for FORKD_IDLE_PAGEOUT_SECS, its
private memory (TCG's translation buffer, QEMU's heap, the guest pages it copied) is paged out to the host's swap
(forkd.vmm.pageout).

After 60 s by default (0 = never), and only to zram: with a zram swap device the pages stay in RAM, compressed; a
swap that is not zram (a disk) is used only with FORKD_IDLE_PAGEOUT_DISK, since guest memory would reach the disk
(SECURITY.md section 9). Without swap nothing is paged out. forkd never turns swap on: the host's admin does (`forkd
doctor` says whether there is any).

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
