"""The claims log: which children are handed out, one appended line per batch claim (one registry transaction).

A claim of n warm children is one `write(2)` of one line to `children/.claims.log` under the registry lock, not n
record rewrites: replacing a file by rename costs a data flush on ext4 (auto_da_alloc), ~15 ms each under load,
where an append costs well under a millisecond. Lines are JSON:

    {"c": ["c0123456789", ...], "at": 1796000000.0, "exp": 1796000600.0, "eb": 12600.0}
                                    claimed at `at`, until `exp` (null: no ttl); `eb`: the same end on
                                    CLOCK_BOOTTIME (forkd.base.clock), what is compared (absent in older logs)
    {"u": ["c0123456789", ...]}     given back (idle again)

Readers (every process that lists children) keep their offset and parse only what was appended since; a line
is read once it ends with a newline, so a half-written one is never seen. A writer that died mid-line leaves a
torn tail: the next writer cuts it off before appending (that claim never reached its caller). Past
COMPACT_BYTES the log is rewritten (renamed into place) with the claims of children that still exist.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from forkd.base import clock
from forkd.base.atomic import write_bytes
from forkd.base.errors import ForkdError

CLAIMS = ".claims.log"
MAX_BYTES = 16 << 20  # refused past this (compaction keeps it near COMPACT_BYTES)
COMPACT_BYTES = 256 << 10  # ~500 batch claims of 32 between rewrites
TAIL_BYTES = 1 << 20  # a torn tail is looked for in this much of the end (a line of 1,000 ids is ~16 KiB)


@dataclass(frozen=True)
class Claim:
    """A hand-out of children: when, and when the claim's ttl ends (None: never) on the time of day (shown) and on
    CLOCK_BOOTTIME (compared: a stepped clock neither shortens nor stretches a ttl)."""

    at: float
    expires_at: float | None = None
    expires_boot: float | None = None

    @classmethod
    def now(cls, ttl_seconds: float | None = None) -> Claim:
        t, boot = clock.wall(), clock.elapsed()
        return cls(t, t + ttl_seconds, boot + ttl_seconds) if ttl_seconds else cls(t)


class ClaimsLog:
    """One registry's view of its claims log; `append` only under the registry's lock."""

    def __init__(self, path: Path):
        self.path = path
        self._mutex = threading.Lock()  # one daemon's threads share a Registry
        self._ino: int | None = None
        self._offset = 0
        self._table: dict[str, Claim] = {}

    def table(self) -> dict[str, Claim]:
        """Child id -> its claim, as of now (do not modify the dict returned)."""
        with self._mutex:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._ino, self._offset, self._table = None, 0, {}
                return self._table
            if st.st_size > MAX_BYTES:
                raise ForkdError(f"claims log {self.path} is {st.st_size} bytes (more than {MAX_BYTES})",
                                 hint=self._hint())
            if st.st_ino != self._ino or st.st_size < self._offset:  # rewritten (compacted): read it all again
                self._ino, self._offset, self._table = st.st_ino, 0, {}
            if st.st_size > self._offset:
                self._read_on(st.st_size)
            return self._table

    def _read_on(self, size: int) -> None:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1  # only whole lines; a line being written is read next time
        if not end:
            return
        table = dict(self._table)  # copy on write: callers may hold the previous one
        for n, line in enumerate(data[:end].splitlines()):
            try:
                apply_line(table, json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ForkdError(f"claims log {self.path}: unreadable line at byte {self._offset} (+{n} lines): "
                                 f"{exc!r}", hint=self._hint()) from exc
        self._offset += end
        self._table = table

    def _hint(self) -> str:
        return (f"stop the daemon, remove {self.path} (claimed children then count as idle) and restart; "
                "'forkd kill' the children you no longer use")

    def append(self, entry: dict, live: Callable[[], Iterable[str]]) -> None:
        """Append one line (call under the registry lock); compact past COMPACT_BYTES, keeping `live()` ids."""
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            size = _cut_torn_tail(fd)
            written = os.write(fd, line)
            if written != len(line):
                os.ftruncate(fd, size)
                raise ForkdError(f"claims log {self.path}: short write ({written} of {len(line)} bytes)",
                                 hint="check the free space of the file system of FORKD_HOME")
        finally:
            os.close(fd)
        if size + len(line) > COMPACT_BYTES:
            self.compact(set(live()))

    def compact(self, live: set[str]) -> None:
        """Rewrite the log with the claims of `live` children only, one line per claim time (under the lock)."""
        groups: dict[Claim, list[str]] = {}
        for cid, c in self.table().items():
            if cid in live:
                groups.setdefault(c, []).append(cid)
        text = "".join(json.dumps(line(ids, c), separators=(",", ":")) + "\n" for c, ids in groups.items())
        write_bytes(self.path, text.encode(), mode=0o600, durable=False)


def line(ids: list[str], claim: Claim) -> dict:
    """The log line of a claim of `ids`."""
    return {"c": ids, "at": claim.at, "exp": claim.expires_at, "eb": claim.expires_boot}


def apply_line(table: dict[str, Claim], entry: dict) -> None:
    """One log line's effect on the table (shape checked: ids are strings, times are numbers)."""
    if "u" in entry:
        for cid in entry["u"]:
            table.pop(str(cid), None)
        return
    exp, eb = entry["exp"], entry.get("eb")
    claim = Claim(float(entry["at"]), None if exp is None else float(exp), None if eb is None else float(eb))
    for cid in entry["c"]:
        if not isinstance(cid, str):
            raise TypeError(f"child id {cid!r} is not a string")
        table[cid] = claim


def _cut_torn_tail(fd: int) -> int:
    """Cut a half-written last line (its writer died) off the log open on `fd`; returns the size after."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    start = max(0, size - TAIL_BYTES)
    tail = os.pread(fd, size - start, start)
    if tail.endswith(b"\n"):
        return size
    keep = start + tail.rfind(b"\n") + 1  # 0 if the log is one torn line
    os.ftruncate(fd, keep)
    return keep
