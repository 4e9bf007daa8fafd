"""Owned temporaries: every temporary file or directory forkd makes carries its maker in its name, so whoever
finds it later (the daemon's start-up recovery, `forkd gc`, a crash harness) removes exactly the dead ones and
never a live process's work in progress.

A maker is a process: its pid and its start time (clock ticks since boot, field 22 of /proc/PID/stat, written in
base 36 to keep socket paths short), so a pid reused by another process is not mistaken for the maker. An owned
name is

    <prefix>-<pid>@<start, base 36>-<random hex><suffix>        e.g. unpack-4242@1ko3x-9f86d081884c
                                                                     .audit.log.tmp-4242@1ko3x-0a1b2c3d4e5f
                                                                     forkd-p-4242@1ko3x-5e884898da28.mem

(`suffix` is empty or starts with a dot). '@' appears in no tag, object name, child id or image id
(forkd.base.names), so no snapshot or object is ever taken for a temporary. The API, for callers that make
temporaries and for those that check:

    owned_name(prefix, suffix="", nbytes=6) -> str   a new name owned by this process (random: nbytes of hex)
    owner_of(name) -> Owner | None                   who made it; None for a name not made by owned_name
    owner_alive(name) -> bool | None                 is its maker still running (None: the name has no owner)
    is_dead_temporary(name) -> bool                  an owned name whose maker is gone: safe to delete
    owned_under(root, depth=3) -> [(Path, Owner)]    every owned name below `root` (links are not followed)
    dead_under(root, depth=3) -> [Path]              those whose maker is gone (what gc removes)

A crash harness asserts "no leftover temporaries" as `not dead_under(home)` (plus the tmpfs directory,
`Layout.shm_dir`). Names made by an older forkd (`unpack-<pid>-<hex>`, no start time) are not owned names; gc
judges them by their pid alone (forkd/sandbox/gc.py).
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from forkd.base.procs import is_alive, start_time

_OWNED = re.compile(r"^(?P<prefix>.+?)-(?P<pid>[0-9]{1,10})@(?P<start>[0-9a-z]{1,13})-(?P<rand>[0-9a-f]{4,64})"
                    r"(?P<suffix>(?:\.[^/]*)?)$")
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Owner:
    pid: int
    started: int  # clock ticks since boot (/proc/PID/stat field 22)

    def alive(self) -> bool:
        return is_alive(self.pid, self.started)


def _b36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
        if n == 0:
            return out


_me: tuple[int, str] | None = None  # (pid, owner token) of this process, recomputed after a fork


def _token() -> str:
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:
        started = start_time(pid)
        if started is None:  # /proc is always there on Linux; never name a temporary nobody can judge
            raise RuntimeError(f"cannot read /proc/{pid}/stat: forkd needs /proc")
        _me = (pid, f"{pid}@{_b36(started)}")
    return _me[1]


def owned_name(prefix: str, suffix: str = "", nbytes: int = 6) -> str:
    """A new temporary's name owned by this process (see the module doc). `prefix` says what it is (no slash);
    `suffix` is empty or starts with '.'."""
    if not prefix or "/" in prefix or (suffix and (not suffix.startswith(".") or "/" in suffix)):
        raise ValueError(f"bad temporary name parts: {prefix!r}, {suffix!r}")
    return f"{prefix}-{_token()}-{secrets.token_hex(nbytes)}{suffix}"


def owner_of(name: str) -> Owner | None:
    """The maker recorded in `name` (a file name, not a path), None when it is not an owned name."""
    m = _OWNED.match(name)
    if m is None:
        return None
    return Owner(int(m["pid"]), int(m["start"], 36))


def owner_alive(name: str) -> bool | None:
    """True while the maker of `name` runs, False once it is gone, None for a name with no owner."""
    owner = owner_of(name)
    return None if owner is None else owner.alive()


def is_dead_temporary(name: str) -> bool:
    return owner_alive(name) is False


def owned_under(root: Path, depth: int = 3) -> list[tuple[Path, Owner]]:
    """Every owned name below `root`, `depth` levels deep at most, not descending into symbolic links nor into
    owned directories themselves (their content goes with them)."""
    out: list[tuple[Path, Owner]] = []
    try:
        it = os.scandir(root)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return out
    with it:
        for entry in it:
            owner = owner_of(entry.name)
            if owner is not None:
                out.append((Path(entry.path), owner))
            elif depth > 1 and entry.is_dir(follow_symlinks=False):
                out += owned_under(Path(entry.path), depth - 1)
    return out


def dead_under(root: Path, depth: int = 3) -> list[Path]:
    """The owned temporaries below `root` whose maker is gone (see owned_under)."""
    return [p for p, owner in owned_under(root, depth) if not owner.alive()]
