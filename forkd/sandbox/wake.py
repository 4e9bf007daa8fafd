"""Paging a child's VMM back in (used only by forkd.sandbox.child, which counts each page-in as a wake on the
child's record): a request to a child whose VMM has memory in swap (the idle loop paged it out, or the kernel did
under pressure) first starts bringing that memory back on another thread, so the request does not
fault it in page by page on the vCPU's own thread (forkd.vmm.pageout.page_in: TCG's translation buffer first).

The request does not wait for it: it runs at once, and each page it touches that the page-in already brought back
costs it nothing more (the page-in maps it) instead of a fault and a read from swap. One page-in per VMM at a
time; a VMM with less than MIN_SWAPPED_KIB in swap is left to fault its pages back itself.
FORKD_PAGE_IN_ON_REQUEST=0 turns it off.

What comes back: FORKD_PAGE_IN_SCOPE=code (the default) reads TCG's translation buffer only, which a request runs
again nearly whole (an `exec true` on a primed child touched 15.8 of its 18 MiB in swap, 2 of 7.5 MiB of heap and
2.7 MiB of guest pages); the rest faults back as the request touches it. `all` reads every swapped page of the
VMM's private mappings: each request then costs the host about twice the CPU (swap-in of pages nobody asked for),
which on a full host slows the next requests. A diff branch reads everything back (`page_in_now`): its pause
reads the guest pages the child wrote."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from forkd.base.errors import ForkdError
from forkd.base.settings import settings
from forkd.vmm.pageout import page_in, status_kib

log = logging.getLogger(__name__)
MIN_SWAPPED_KIB = 1024  # less than this in swap is not worth a thread

_running: dict[int, threading.Thread] = {}  # VMM pid -> the thread paging it in now
_lock = threading.Lock()
WAIT_S = 30.0  # how long page_in_now waits for a page-in already running


def wake(pid: int | None, started: int | None) -> threading.Thread | None:
    """Start paging the VMM `pid` back in if it has memory in swap; the thread, or None when there is nothing to
    do (off, little in swap, one already running, the VMM gone)."""
    if pid is None or not settings().page_in_on_request or _swapped_kib(pid) < MIN_SWAPPED_KIB:
        return None
    t = threading.Thread(target=_page_in, args=(pid, started), name=f"forkd-page-in-{pid}", daemon=True)
    if not _claim(pid, started, t):
        return None
    t.start()
    return t


def record(write: Callable[[], None]) -> threading.Thread:
    """Run `write` (a wake's record update) on a thread of its own, started now: the request it belongs to goes on
    meanwhile and joins it before it lets the child sleep again. A write that raises is logged (the record is
    bookkeeping: the child runs either way)."""
    def run() -> None:
        try:
            write()
        except Exception:  # noqa: BLE001 - bookkeeping: the request goes on
            log.exception("a wake's record was not written")
    t = threading.Thread(target=run, name="forkd-wake-record", daemon=True)
    t.start()
    return t


def page_in_now(pid: int, started: int | None, min_kib: int = MIN_SWAPPED_KIB) -> int:
    """Page the VMM `pid` back in on this thread if it has at least `min_kib` in swap (a diff branch, before its
    pause); a page-in of it already running is waited for first. Returns the
    KiB this call read back."""
    with _lock:
        other = _running.get(pid)
    if other is not None:
        other.join(WAIT_S)
    if _swapped_kib(pid) < min_kib or not _claim(pid, started, threading.current_thread()):
        return 0
    try:
        return page_in(pid, started)
    finally:
        with _lock:
            _running.pop(pid, None)


def _swapped_kib(pid: int) -> int:
    try:
        return status_kib(pid, "VmSwap")
    except OSError:  # the VMM is gone: the caller will say so
        return 0


def _claim(pid: int, started: int | None, thread: threading.Thread) -> bool:
    """Record `thread` as the one paging `pid` in; False if another one is at it."""
    with _lock:
        if pid in _running:
            return False
        _running[pid] = thread
        return True


def _page_in(pid: int, started: int | None) -> None:
    try:
        page_in(pid, started, code_only=settings().page_in_scope == "code")
    except (ForkdError, OSError) as exc:  # the request still runs; its pages fault back in as it touches them
        log.debug("page-in of VMM %s: %s", pid, exc)
    finally:
        with _lock:
            _running.pop(pid, None)
