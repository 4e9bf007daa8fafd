"""The two clocks lifetimes are measured on, and the one seam tests step them through.

`wall()` is the time of day (time.time()): what users read and give (`expires_at`, a claim's `shutdown_at`).
`elapsed()` is CLOCK_BOOTTIME: seconds since boot, suspend included, which no step of the time of day (NTP, an
admin's `date -s`, a VM's host) moves. A lifetime given as a duration ends at an `elapsed()` deadline, so a clock
stepped forward ends no sandbox early and one stepped back keeps none longer. The deadline is meaningful only on
the boot that set it, which no child outlives."""

from __future__ import annotations

import time


def wall() -> float:
    return time.time()


def elapsed() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)
