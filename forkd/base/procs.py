"""Processes: identity that survives pid reuse (a pid is only 'ours' if its start time matches the record), and
`run`, the one way forkd runs a host tool (apt-get, mkfs.ext4, nft, ...) with one error shape."""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Container, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from forkd.base.errors import ForkdError


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


def is_stopped(pid: int, started: int | None) -> bool:
    """Whether `pid` (still the process that started at `started`) is stopped by a signal or a tracer (state T or
    t in /proc/PID/stat): it holds its sockets open but answers nothing until SIGCONT."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] in ("T", "t") and (started is None or int(fields[19]) == started)


def is_alive(pid: int, started: int | None) -> bool:
    st = start_time(pid)
    return st is not None and (started is None or st == started)


def pidfd_of(pid: int, started: int) -> int | None:
    """A pidfd of `pid` if it is still the process that started at `started` (None if it is gone or the pid was
    reused since it was seen). A signal sent through it can reach no other process, whatever happens to the pid."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None
    if start_time(pid) != started:  # checked after the open: the fd holds the process whose start time this is
        os.close(fd)
        return None
    return fd


def kill_pidfd(fd: int, timeout: float = 5.0) -> None:
    """SIGKILL the process of pidfd `fd` and wait (the fd turns readable) until it has exited or `timeout` passed."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.poll(timeout * 1000)


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


# -- running host tools ----------------------------------------------------------------------------------------
TAIL_CHARS = 500


def _tail(stderr: str, stdout: str) -> str:
    return (stderr.strip() or stdout.strip())[-TAIL_CHARS:] or "no message"


def _shown(argv: Sequence[str | os.PathLike]) -> str:
    text = shlex.join(str(a) for a in argv)
    return text if len(text) <= 200 else text[:197] + "..."


def run(argv: Sequence[str | os.PathLike], what: str | None = None, *, hint: str | None = None,
        error: type[ForkdError] = ForkdError, ok: Container[int] | None = (0,), timeout: float | None = None,
        cwd: Path | None = None, env: Mapping[str, str] | None = None, input: str | None = None,
        stdout: IO[Any] | None = None, tail: Callable[[str, str], str] = _tail) -> subprocess.CompletedProcess[str]:
    """Run a host tool to completion (text, output captured unless `stdout` is a file) and return the result.

    An exit code outside `ok` (None: any code is fine), a missing binary or a timeout raise `error` naming what was
    being done (`what`), the command, the exit code and the end of its stderr (or stdout; `tail` picks it), with
    `hint`."""
    label = what or Path(str(argv[0])).name
    try:
        res = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, input=input, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL if input is None else None,
                             stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise error(f"{label}: {argv[0]} not found", hint=hint) from None
    except subprocess.TimeoutExpired:
        raise error(f"{label}: {_shown(argv)} timed out after {timeout:g} s", hint=hint) from None
    if ok is not None and res.returncode not in ok:
        raise error(f"{label} failed: {_shown(argv)} exited {res.returncode}: {tail(res.stderr, res.stdout or '')}",
                    hint=hint)
    return res
