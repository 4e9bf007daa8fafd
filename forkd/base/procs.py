"""Process identity that survives pid reuse: a pid is only 'ours' if its start time matches the record."""

from __future__ import annotations

import os
import signal
import time


def start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def is_alive(pid: int, started: int | None) -> bool:
    st = start_time(pid)
    return st is not None and (started is None or st == started)


def kill_and_wait(pid: int, started: int | None, timeout: float = 5.0) -> bool:
    """SIGKILL the process if it is still the one recorded; wait until it is gone. True if it was running."""
    if not is_alive(pid, started):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)  # our own child: reap it
            if done:
                return True
        except ChildProcessError:
            pass
        if not is_alive(pid, started):
            return True
        time.sleep(0.005)
    return True
