"""Tamper-evident audit log: one JSON line per mutating API call and per reconciler action, appended and
fsynced to $FORKD_HOME/audit.log.

Each line carries `prev`, the sha256 (hex) of the previous line's bytes (without its newline); the first line's
`prev` is 64 zeros. Editing, inserting or deleting a line breaks the chain at the next line. Cutting lines off the
end leaves a valid chain, so every append also records (line count, hash of the last line) in `audit.head`, a
fixed-size record rewritten in place and fsynced: a log shorter than its head, or whose last hash differs, has
been truncated. (Someone who can rewrite both files can forge both; ship the head elsewhere to anchor it.)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
LOG_NAME = "audit.log"
HEAD_NAME = "audit.head"
_HEAD_SIZE = 96


def _digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def token_id(token: str) -> str:
    """How a bearer token appears in the log: the first 12 hex digits of its sha256 (never the token)."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


class AuditLog:
    """Appends hash-chained lines. Thread-safe; an flock keeps other processes' appends from interleaving."""

    def __init__(self, home: Path):
        self.path = Path(home) / LOG_NAME
        self.head_path = Path(home) / HEAD_NAME
        self._lock = threading.Lock()
        self._cache: tuple[int, str, int] | None = None  # (file size, last hash, line count) after our append

    def _tail(self, fd: int) -> tuple[str, int]:
        """(hash of the last line, number of lines) as the file is now: from the cache when nobody else
        appended since our last write (same size), else by reading the file once."""
        size = os.fstat(fd).st_size
        if self._cache and self._cache[0] == size:
            return self._cache[1], self._cache[2]
        if size == 0:
            return GENESIS, 0
        data = os.pread(fd, size, 0)
        lines = data.rstrip(b"\n").split(b"\n")
        return _digest(lines[-1]), len(lines)

    def append(self, actor: str, action: str, target: str, result: str, latency_ms: float,
               **extra: Any) -> dict:
        entry: dict[str, Any] = {"time": round(time.time(), 6), "actor": actor, "action": action, "target": target,
                                 "result": result, "latency_ms": round(float(latency_ms), 3)}
        entry.update(extra)
        with self._lock:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                prev, count = self._tail(fd)
                entry["prev"] = prev
                line = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
                os.write(fd, line + b"\n")
                os.fsync(fd)
                self._write_head(count + 1, _digest(line))
                self._cache = (os.fstat(fd).st_size, _digest(line), count + 1)
            finally:
                os.close(fd)
        return entry

    def _write_head(self, count: int, last: str) -> None:
        rec = f"{count} {last}".encode().ljust(_HEAD_SIZE - 1) + b"\n"
        hfd = os.open(self.head_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.pwrite(hfd, rec, 0)
            os.fsync(hfd)
        finally:
            os.close(hfd)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    lines: int
    bad_line: int | None = None  # 1-based
    reason: str = ""

    def __str__(self) -> str:
        if self.ok:
            return f"OK: {self.lines} lines, chain intact"
        where = f"line {self.bad_line}: " if self.bad_line else ""
        return f"TAMPERED: {where}{self.reason}"


def verify(home: Path) -> Verdict:
    """Check the chain of $FORKD_HOME/audit.log and its head record."""
    path, head_path = Path(home) / LOG_NAME, Path(home) / HEAD_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if head_path.exists():
            return Verdict(False, 0, None, f"{path} is missing but {head_path} records appends")
        return Verdict(True, 0)
    if data and not data.endswith(b"\n"):
        n = data.count(b"\n") + 1
        return Verdict(False, n, n, "last line is cut off (no newline)")
    lines = data.split(b"\n")[:-1] if data else []
    prev = GENESIS
    for i, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            return Verdict(False, len(lines), i, "not valid JSON")
        if not isinstance(entry, dict) or entry.get("prev") != prev:
            return Verdict(False, len(lines), i, "hash chain broken: `prev` does not match the previous line "
                                                 "(an edited, inserted or removed line)")
        prev = _digest(line)
    try:
        count_s, last = head_path.read_text().split()[:2]
        count = int(count_s)
    except FileNotFoundError:
        if lines:
            return Verdict(False, len(lines), None, f"{head_path} is missing")
        return Verdict(True, 0)
    except ValueError:
        return Verdict(False, len(lines), None, f"{head_path} is unreadable")
    if len(lines) < count:
        return Verdict(False, len(lines), len(lines) + 1 if lines else 1,
                       f"truncated: the head records {count} lines, the log has {len(lines)}")
    if len(lines) == count and prev != last:
        return Verdict(False, len(lines), len(lines), "the last line differs from the one the head recorded")
    if len(lines) > count and count and _digest(lines[count - 1]) != last:
        # lines after the head's are tolerated (a crash between the two fsyncs), not a replaced recorded line
        return Verdict(False, len(lines), count, "the line the head recorded was replaced")
    return Verdict(True, len(lines))
