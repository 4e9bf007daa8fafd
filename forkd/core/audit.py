"""Tamper-evident audit log: one JSON line per mutating API call and per reconciler action, appended and
fsynced to $FORKD_HOME/audit.log.

Each line carries `prev`, the sha256 (hex) of the previous line's bytes (without its newline); the first line's
`prev` is 64 zeros. Editing, inserting or deleting a line breaks the chain at the next line. Cutting lines off the
end leaves a valid chain, so every append also records (line count, hash of the last line) in `audit.head`, a
fixed-size record rewritten in place and fsynced: a log shorter than its head, or whose last hash differs, has
been truncated. (Someone who can rewrite both files can forge both; ship the head elsewhere to anchor it.)

Appends are all or nothing: one write of the whole line under the process lock and an flock, its length checked,
fsynced; a short or failed write is cut back off and raised (AuditError). A torn tail (bytes after the last newline:
a write a crash cut short) is never silently accepted nor left to poison the chain: the next append, or the daemon
at start (`recover`), cuts it off and records the cut as a chain entry (action `recover-torn-tail`: how many bytes,
their sha256, the line count and the head's count at that moment). `verify` reports each recovery (and says
TAMPERED if one was made after lines the head recorded had gone). Entries whose append failed are not silently
dropped either: the next successful append first writes a `lost-entries` entry naming them (up to LOST_KEPT).
Their count is also kept in the head record (rewritten in place, so it needs no new disk space when the disk is
full), so a daemon restarted before the log could be written again still records them, and `verify` reports
entries lost and not yet recorded (not OK) instead of a clean chain.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkd.base.errors import Unavailable

GENESIS = "0" * 64
LOG_NAME = "audit.log"
HEAD_NAME = "audit.head"
_HEAD_SIZE = 96
RECOVERY = "recover-torn-tail"  # the action of the entry recording a cut torn tail
LOST = "lost-entries"  # the action of the entry naming appends that failed
LOST_KEPT = 20  # lost entries named one by one in a `lost-entries` entry (the rest are counted)

log = logging.getLogger("forkd.audit")


class AuditError(Unavailable):
    """An audit line could not be written (disk full, I/O error): nothing of it is left in the log."""


def _digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def token_id(token: str) -> str:
    """How a bearer token appears in the log: the first 12 hex digits of its sha256 (never the token)."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def _entry(actor: str, action: str, target: str, result: str, latency_ms: float, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"time": round(time.time(), 6), "actor": actor, "action": action, "target": target,
                             "result": result, "latency_ms": round(float(latency_ms), 3)}
    entry.update(extra)
    return entry


class AuditLog:
    """Appends hash-chained lines. Thread-safe; an flock keeps other processes' appends from interleaving."""

    def __init__(self, home: Path):
        self.path = Path(home) / LOG_NAME
        self.head_path = Path(home) / HEAD_NAME
        self._lock = threading.Lock()
        self._cache: tuple[int, str, int] | None = None  # (file size, last hash, line count) after our append
        self._lost: list[dict[str, Any]] = []  # the first LOST_KEPT entries whose append failed
        self._lost_count = _head_fields(self.head_path)[2]  # failed appends not yet recorded (kept in the head)

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

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
        """Append one entry (all of it or nothing: AuditError, and the entry is named by the next append)."""
        entry = _entry(actor, action, target, result, latency_ms, **extra)
        with self._lock:
            try:
                fd = self._open()
            except OSError as exc:
                self._note_lost(entry)
                raise AuditError(f"cannot open the audit log {self.path}: {exc.strerror or exc}",
                                 hint="make $FORKD_HOME writable (disk full?)") from None
            try:
                self._recover_tail(fd)
                if self._lost_count:
                    self._write_lost(fd)
                self._write(fd, entry)
            except (OSError, AuditError) as exc:
                self._note_lost(entry)
                if isinstance(exc, AuditError):
                    raise
                raise AuditError(f"cannot append to the audit log {self.path}: {exc.strerror or exc}",
                                 hint="free space on $FORKD_HOME's filesystem") from None
            finally:
                os.close(fd)
        return entry

    def recover(self) -> dict | None:
        """Cut a torn tail off and record the cut (see the module doc); the recovery entry, or None when the log
        ends with a whole line. The daemon calls it at start; every append does it too."""
        with self._lock:
            fd = self._open()
            try:
                return self._recover_tail(fd)
            finally:
                os.close(fd)

    def _recover_tail(self, fd: int) -> dict | None:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return None
        data = os.pread(fd, size, 0)
        cut = data.rfind(b"\n") + 1
        torn = data[cut:]
        os.ftruncate(fd, cut)
        os.fsync(fd)
        self._cache = None
        _, lines = self._tail(fd)
        entry = _entry("forkd", RECOVERY, LOG_NAME, "recovered", 0.0, torn_bytes=len(torn),
                       torn_sha256=_digest(torn), offset=cut, lines=lines, head_lines=_head_count(self.head_path))
        self._write(fd, entry)
        log.warning("audit log %s ended with a torn line (%d bytes, a write cut short by a crash): cut off and "
                    "recorded as line %d", self.path, len(torn), lines + 1)
        return entry

    def _write(self, fd: int, entry: dict[str, Any]) -> None:
        """One write of the whole line, its length checked, fsynced, then the head; a short write is undone."""
        prev, count = self._tail(fd)
        entry["prev"] = prev
        line = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        data = line + b"\n"
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
        except OSError as exc:
            self._undo(fd, before)
            raise AuditError(f"cannot append to the audit log {self.path}: {exc.strerror or exc}",
                             hint="free space on $FORKD_HOME's filesystem") from None
        if written != len(data):
            self._undo(fd, before)
            raise AuditError(f"short write to the audit log {self.path}: {written} of {len(data)} bytes; the "
                             "partial line was cut off again", hint="free space on $FORKD_HOME's filesystem")
        os.fsync(fd)
        try:  # the line is in: a stale head only tolerates it as a line after the recorded ones until next time
            self._write_head(count + 1, _digest(line), self._lost_count)
        except OSError:
            log.exception("could not update the audit head %s", self.head_path)
        self._cache = (before + len(data), _digest(line), count + 1)

    def _undo(self, fd: int, size: int) -> None:
        self._cache = None
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError:  # left for the next append (or the daemon's start) to cut and record
            log.exception("could not cut a partial audit line off %s", self.path)

    def _note_lost(self, entry: dict[str, Any]) -> None:
        self._lost_count += 1
        if len(self._lost) < LOST_KEPT:
            self._lost.append({k: entry.get(k) for k in ("time", "actor", "action", "target", "result")})
        log.error("audit entry lost (append failed): %s %s %s", entry.get("actor"), entry.get("action"),
                  entry.get("target"))
        count, last, _ = _head_fields(self.head_path)
        try:
            self._write_head(count or 0, last or GENESIS, self._lost_count)
        except OSError:
            log.exception("could not record the lost audit entry's count in %s", self.head_path)

    def _write_lost(self, fd: int) -> None:
        entry = _entry("forkd", LOST, LOG_NAME, "error", 0.0, count=self._lost_count, entries=list(self._lost))
        kept = self._lost, self._lost_count
        self._lost, self._lost_count = [], 0  # the head written with this line records none pending
        try:
            self._write(fd, entry)
        except BaseException:
            self._lost, self._lost_count = kept
            raise

    def _write_head(self, count: int, last: str, lost: int = 0) -> None:
        rec = f"{count} {last} {lost}".encode().ljust(_HEAD_SIZE - 1) + b"\n"
        hfd = os.open(self.head_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.pwrite(hfd, rec, 0) != len(rec):
                raise OSError(f"short write to {self.head_path}")
            os.fsync(hfd)
        finally:
            os.close(hfd)


def _head_fields(head_path: Path) -> tuple[int | None, str | None, int]:
    """(line count, last hash, failed appends not yet recorded) of a head record; (None, None, 0) if unreadable."""
    try:
        fields = head_path.read_text().split()
        return int(fields[0]), fields[1], int(fields[2]) if len(fields) > 2 else 0
    except (FileNotFoundError, ValueError, IndexError):
        return None, None, 0


def _head_count(head_path: Path) -> int | None:
    return _head_fields(head_path)[0]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    lines: int
    bad_line: int | None = None  # 1-based
    reason: str = ""
    torn: bool = False  # not ok only because a torn tail awaits its recovery (the chain before it is intact)
    recovered: tuple[int, ...] = field(default=())  # lines recording a cut torn tail
    lost: int = 0  # entries named by `lost-entries` lines (appends that failed)
    pending_lost: int = 0  # appends that failed since the last line (counted in the head, not yet in the log)

    def __str__(self) -> str:
        if self.ok:
            text = f"OK: {self.lines} lines, chain intact"
            if self.recovered:
                text += (f"; {len(self.recovered)} torn tail(s) cut off after a crash and recorded (line "
                         f"{', '.join(map(str, self.recovered))})")
            if self.lost:
                text += f"; {self.lost} entries could not be written (named in {LOST} lines)"
            return text
        if self.pending_lost and not self.bad_line:
            return (f"INCOMPLETE: {self.lines} lines, chain intact, but {self.pending_lost} entries could not be "
                    "written since the last line (appends failed: disk full?); the next append that works records "
                    "them in a lost-entries line")
        where = f"line {self.bad_line}: " if self.bad_line else ""
        return f"{'TORN' if self.torn else 'TAMPERED'}: {where}{self.reason}"


def _chain(lines: list[bytes]) -> tuple[str, Verdict | None, tuple[int, ...], int]:
    """(hash of the last line, a failed Verdict or None, recovery lines, lost entries) of whole lines."""
    prev, recovered, lost = GENESIS, [], 0
    for i, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            return prev, Verdict(False, len(lines), i, "not valid JSON"), (), 0
        if not isinstance(entry, dict) or entry.get("prev") != prev:
            return prev, Verdict(False, len(lines), i, "hash chain broken: `prev` does not match the previous "
                                                       "line (an edited, inserted or removed line)"), (), 0
        if entry.get("actor") == "forkd" and entry.get("action") == RECOVERY:
            head_lines = entry.get("head_lines")
            if isinstance(head_lines, int) and head_lines > i - 1:
                return prev, Verdict(False, len(lines), i, f"a torn tail was cut when the log had {i - 1} whole "
                                                           f"lines but its head recorded {head_lines}: lines had "
                                                           "been removed before"), (), 0
            recovered.append(i)
        if entry.get("actor") == "forkd" and entry.get("action") == LOST and isinstance(entry.get("count"), int):
            lost += entry["count"]
        prev = _digest(line)
    return prev, None, tuple(recovered), lost


def _read_head(head_path: Path) -> str | None:
    """The head record's text, None when there is none."""
    try:
        return head_path.read_text()
    except FileNotFoundError:
        return None


def _read_log(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def verify(home: Path) -> Verdict:
    """Check the chain of $FORKD_HOME/audit.log and its head record (see the module doc).

    The head is read before the log: an append landing between the two reads then shows as a line after the
    head's, which is tolerated; read the other way round, a log read just before an append and a head read just
    after it looked truncated (the head counting a line the log read did not have)."""
    path, head_path = Path(home) / LOG_NAME, Path(home) / HEAD_NAME
    head = _read_head(head_path)
    data = _read_log(path)
    if data is None:
        if head is not None:
            return Verdict(False, 0, None, f"{path} is missing but {head_path} records appends")
        return Verdict(True, 0)
    whole = data[:data.rfind(b"\n") + 1]
    torn = len(data) - len(whole)
    lines = whole.split(b"\n")[:-1] if whole else []
    prev, bad, recovered, lost = _chain(lines)
    if bad is not None:
        return bad
    if head is None:
        if lines:
            return Verdict(False, len(lines), None, f"{head_path} is missing")
        count, last, pending = 0, GENESIS, 0
    else:
        try:
            fields = head.split()
            count, last, pending = int(fields[0]), fields[1], int(fields[2]) if len(fields) > 2 else 0
        except (ValueError, IndexError):
            return Verdict(False, len(lines), None, f"{head_path} is unreadable")
    return _judge(lines, prev, torn, count, last, pending, recovered, lost)


def _judge(lines: list[bytes], prev: str, torn: int, count: int, last: str, pending: int,
           recovered: tuple[int, ...], lost: int) -> Verdict:
    """The verdict on a log of whole `lines` (chain intact, ending in `prev`) against its head (count, last)."""
    cut = f" (and the last line is cut off: {torn} bytes without a newline)" if torn else ""
    if len(lines) < count:
        return Verdict(False, len(lines), len(lines) + 1 if lines else 1,
                       f"truncated: the head records {count} lines, the log has {len(lines)}{cut}")
    if len(lines) == count and prev != last:
        return Verdict(False, len(lines), len(lines), f"the last line differs from the one the head recorded{cut}")
    if len(lines) > count and count and _digest(lines[count - 1]) != last:
        # lines after the head's are tolerated (a crash between the two fsyncs), not a replaced recorded line
        return Verdict(False, len(lines), count, f"the line the head recorded was replaced{cut}")
    if torn:
        return Verdict(False, len(lines), len(lines) + 1,
                       f"the last line is cut off ({torn} bytes without a newline) after every line the head "
                       "recorded: a write cut short by a crash. The daemon cuts it off and records the cut at "
                       "its start or next append", torn=True, recovered=recovered, lost=lost)
    return Verdict(not pending, len(lines), recovered=recovered, lost=lost, pending_lost=pending)
