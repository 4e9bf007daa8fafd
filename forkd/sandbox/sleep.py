"""Sleeping idle children: with FORKD_IDLE_SLEEP, the daemon's sweeper (forkd.core.idle) stops the vCPUs of a
child it pages out, so it costs no CPU at all and faults nothing back in while it sleeps; the child's next request
resumes it first (`awake`, in `Runtime.agent`, the one door every request goes through) and sets its clock.

A sleeping child is marked by a file of its own directory (MARKER), made by the sweeper just before it stops the
VM and removed by the request that resumes it, so any process (the daemon, a CLI run in-process, a process that
restarted) knows to resume it. Every request holds the child's wake lock (WAKE_LOCK) shared while it runs, and the
sweeper puts a child to sleep only if it gets that lock exclusively without waiting: never while a request, a
process stream or a file transfer is in flight. A branch in flight holds the child's branch lock, which the sweeper
also needs. A branch of a sleeping child captures it as it is and leaves it asleep.

What sleeping changes for the guest: its clock stands still while it sleeps (QEMU stops the guest's time with its
vCPUs), so `awake` sets the wall clock from the host's on the first request (the agent's `clock` op; an agent of a
snapshot older than that op is left as it is); timers inside the guest (a `sleep 60` in a background job) fire late
by the time it slept, and a process that works without using CPU (waits on the network) is frozen with it. So it is
for children that only answer requests, and off by default.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.locks import Flock
from forkd.sandbox.registry import ChildRecord
from forkd.sandbox.supervisor import attached
from forkd.vmm.driver import VmmDriver

log = logging.getLogger(__name__)
MARKER = "asleep"  # in the child's directory: the sweeper stopped it
WAKE_LOCK = "wake.lock"  # in the child's directory: shared by requests, exclusive while the sweeper stops it


def asleep(rec: ChildRecord) -> bool:
    return os.path.lexists(Path(rec.dir) / MARKER)


def put_to_sleep(driver: VmmDriver, rec: ChildRecord, branch_lock: Path) -> bool:
    """Stop the child's vCPUs and mark it asleep, unless a request or a branch is in flight (then False; the
    sweeper tries again in the child's next idle stretch)."""
    d = Path(rec.dir)
    try:
        wake_lock = Flock(d / WAKE_LOCK, blocking=False)
    except BlockingIOError:
        return False
    with wake_lock:
        try:
            branch = Flock(branch_lock, blocking=False)
        except BlockingIOError:
            return False
        with branch:
            fd = os.open(d / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.close(fd)
            try:
                with attached(driver, rec) as vm:
                    driver.pause(vm)
            except BaseException:
                os.unlink(d / MARKER)
                raise
    return True


@contextlib.contextmanager
def awake(driver: VmmDriver, rec: ChildRecord) -> Iterator[bool]:
    """Hold the child awake while the block runs (its wake lock, shared); resume it first if it sleeps. Yields
    True when it had to be resumed (the caller then sets the guest's clock: `set_clock`)."""
    d = Path(rec.dir)
    try:
        lock = Flock(d / WAKE_LOCK, shared=True)
    except FileNotFoundError:  # its directory is gone: the child was removed; the request says so
        yield False
        return
    with lock:
        woke = False
        if os.path.lexists(d / MARKER):
            with attached(driver, rec, timeout=10) as vm:
                driver.ensure_running(vm)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(d / MARKER)
            woke = True
        yield woke


def set_clock(agent, now: float) -> None:
    """The guest's wall clock to `now` after a sleep; an agent without the `clock` op is left as it is."""
    try:
        agent.call("clock", {"time": now}, timeout=5)
    except ForkdError as exc:
        log.debug("child's clock not set after its sleep: %s", exc.message)
