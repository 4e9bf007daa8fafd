"""The two clocks lifetimes and claim ttls are measured on, and the one seam tests step them through.

`wall()` is the time of day (time.time()): what users read and give (`expires_at`, a claim's `shutdown_at`).
`elapsed()` is CLOCK_BOOTTIME: seconds since boot, suspend included, which no step of the time of day (NTP, an
admin's `date -s`, a VM's host) moves. A lifetime or claim ttl ends at an `elapsed()` deadline kept beside its
time-of-day end, so a clock stepped forward ends no sandbox early and one stepped back keeps none longer. The
deadline is read from disk by every process, so it survives a daemon restart; it is meaningful only on the boot
that set it, which no child outlives."""

from __future__ import annotations

import time


def wall() -> float:
    return time.time()


def elapsed() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def deadline(seconds: float | None) -> tuple[float | None, float | None]:
    """The end of a span of `seconds` from now, as (time of day, CLOCK_BOOTTIME); (None, None) for no end."""
    if seconds is None:
        return None, None
    return wall() + seconds, elapsed() + seconds


def until(wall_end: float | None) -> tuple[float | None, float | None]:
    """An end given as a time of day (a claim's `shutdown_at`), fixed now as a span on CLOCK_BOOTTIME too."""
    if wall_end is None:
        return None, None
    now = wall()
    return wall_end, elapsed() + (wall_end - now)


def project(wall_end: float | None, boot_end: float | None, now: float, boot: float) -> float | None:
    """When an end falls on the time of day as the clock reads now (`now`, with `boot` = elapsed() at that
    moment): from its CLOCK_BOOTTIME deadline when it has one, else (a record of an older forkd) its time of day."""
    if boot_end is not None:
        return now + (boot_end - boot)
    return wall_end


def ended(wall_end: float | None, boot_end: float | None, now: float, boot: float) -> bool:
    """Whether an end (None: never) has come, by its CLOCK_BOOTTIME deadline when it has one."""
    at = project(wall_end, boot_end, now, boot)
    return at is not None and at <= now
