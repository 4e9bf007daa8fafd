"""The daemon's idle sweeper run inside a benchmark (bench/density.py): forkd.core.idle.IdleReclaimer ticking on a
thread, and a wait until the children are paged out."""

from __future__ import annotations

import statistics
import sys
import threading
import time

from forkd.base.errors import ForkdError
from forkd.core.idle import IdleReclaimer
from forkd.core.posture import ZRAM_FIX
from forkd.core.runtime import Runtime
from forkd.vmm.pageout import swap_total_kib


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float | None:
    return statistics.median(xs) if xs and p == 50 else None


def page_out_idle(rt: Runtime, recs: list, idle_s: float, limit_s: float = 120.0, scope: str = "private") -> dict:
    """What the daemon's sweeper does with FORKD_IDLE_PAGEOUT_SECS=idle_s (forkd.core.idle), run here in-process:
    look every second until every child was paged out once (or `limit_s`)."""
    with Sweeper(rt, idle_s, scope) as sweeper:
        return sweeper.wait_paged(recs, limit_s)


class Sweeper:
    """The daemon's sweeper in this process: a thread calling IdleReclaimer.tick every second while the block runs
    (a climb keeps one for the whole run, so a child is paged out once per idle stretch, and again once a request
    woke it, as in the daemon)."""

    def __init__(self, rt: Runtime, idle_s: float, scope: str = "private"):
        self.rt, self.reclaimer, self.stop = rt, IdleReclaimer(idle_s, scope), threading.Event()
        if swap_total_kib() == 0 or not self.reclaimer.swap_allowed():  # the daemon's own test: zram only by default
            raise ForkdError(f"paging out here needs a zram swap: {self.reclaimer.why_not or 'the host has none'}",
                             hint=ZRAM_FIX)
        self.moved: dict[str, float] = {}  # MiB each child's latest page-out moved
        self.cpu_ms, self.ticks, self.page_outs = 0.0, 0, 0  # the sweeper thread's own CPU (page-outs included)
        self.thread = threading.Thread(target=self._run, name="bench-sweeper", daemon=True)

    def __enter__(self) -> Sweeper:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            c0 = time.thread_time()
            try:
                done = self.reclaimer.tick(self.rt)
                self.moved.update({c: p.moved_kib / 1024.0 for c, p in done.items()})
                self.page_outs += len(done)
            except Exception as exc:  # noqa: BLE001 - a child killed mid-look; the next tick looks again
                progress(f"sweeper: {exc}")
            self.cpu_ms += (time.thread_time() - c0) * 1000.0
            self.ticks += 1

    def counters(self) -> tuple[float, int, int]:
        """(CPU ms, ticks, page-outs) so far: a caller subtracts two readings to see one phase's share."""
        return self.cpu_ms, self.ticks, self.page_outs

    def paged_now(self, want: set[str]) -> int:
        return sum(1 for cid in want if (w := self.reclaimer.watches.get(cid)) is not None and w.paged)

    def wait_paged(self, recs: list, limit_s: float = 120.0) -> dict:
        """Wait until every child of `recs` is paged out in its current idle stretch (or `limit_s`)."""
        want, t0 = {r.id for r in recs}, time.monotonic()
        while self.paged_now(want) < len(want) and time.monotonic() - t0 < limit_s:
            time.sleep(0.5)
        moved = [self.moved[c] for c in want if c in self.moved]
        progress(f"{self.paged_now(want)} of {len(want)} idle children paged out ({time.monotonic() - t0:.0f} s; "
                 f"{pct(moved, 50) or 0:.1f} MiB each p50 at their latest page-out)")
        return {"paged": self.paged_now(want), "of": len(want), "moved_mib_p50": pct(moved, 50)}
