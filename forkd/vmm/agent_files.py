"""Host side of the guest agent's file ops (forkd/guest/agent_fs.py), over an AgentClient.

The guest is hostile (SECURITY.md section 1): what it reports is checked before it is believed.

* Every reply's shape is checked (fields, types); a misshapen one is a ProtocolViolation (the runtime stops the
  child), as for the other ops.
* Chunks are bounded by what the host asked for: `fs_read` / `fs_stream_read` may return at most `length` bytes
  (checked on the base64 text's length before it is decoded), a list page at most the `limit` entries asked, a
  watch poll at most its `limit` events; names are one path component (no `/`, no NUL, not `.` or `..`,
  at most 255 bytes) and list pages must advance (a guest cannot make the host loop on one page).
* Requests are bounded too: a chunk sent to the guest is at most MAX_CHUNK bytes, so any size is many frames.

Transfers are one request/response per chunk, keyed by offset (files), upload token (writes) or stream id (tar),
so they do not depend on how the transport frames or multiplexes calls.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from forkd.base.errors import InvalidInput
from forkd.base.taranswer import answer_only, top_name
from forkd.vmm.agent_client import AgentClient

CHUNK = 1 << 20  # default bytes per read/write request
MAX_CHUNK = 4 << 20  # the most a chunk may be (the agent's FS_CHUNK_MAX)
LIST_PAGE = 200  # entries per list page (the agent's FS_LIST_MAX; 2 strings each, agent_replies.MAX_STRINGS)
MAX_ENTRIES = 100_000  # entries one list() returns, all pages and depths together
MAX_BYTES = 64 << 20  # entry_bytes of one list(), all pages together
PAGE_ENTRIES = 100_000  # entries of one list_page() (a page of the files/list route)
PAGE_BYTES = 4 << 20  # entry_bytes of one list_page(): what one answer holds, however the guest shapes its tree
ENTRY_OVERHEAD = 160  # bytes an entry costs besides its strings (the JSON of its other fields, with margin)
MAX_CURSOR = 8192  # characters of a listing cursor (a path of at most MAX_PATH bytes, base64)
MAX_EVENTS = 200  # events per watch poll (the agent's FS_EVENTS_MAX)
MAX_NAME = 255  # bytes of one name
MAX_PATH = 4096  # bytes of a path the guest reports (a symlink's target)
MAX_ERROR = 1000  # characters of a guest's error text passed on in an upload's reply
TYPES = frozenset({"file", "dir", "symlink", "other"})
EVENTS = frozenset({"create", "write", "remove", "rename", "chmod"})


@dataclass(frozen=True)
class Entry:
    """One directory entry or stat result (`path` is absolute in the guest)."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: float
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _num(v: Any, what: str, lo: float = 0, hi: float = float(1 << 62)) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise ValueError(f"{what} is not a number in [{lo}, {hi}]")
    return v


def check_name(name: Any) -> str:
    """A single path component the guest reported; ValueError if it could be anything else."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"name {str(name)[:80]!r} is not one path component")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
        raise ValueError(f"a name of over {MAX_NAME} bytes")
    return name


def join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name


class AgentFiles:
    """File operations in one child, through its agent connection `client`."""

    def __init__(self, client: AgentClient, timeout: float = 60.0):
        self.client, self.timeout = client, timeout

    def _bad(self, what: str) -> Any:
        self.client._violate(what)  # closes the (shared) connection for good and raises ProtocolViolation

    def _call(self, op: str, args: dict, fields: dict[str, tuple[type, ...]]) -> dict:
        res = self.client.call(op, args, timeout=self.timeout)
        if not isinstance(res, dict):
            self._bad(f"{op} returned a JSON {type(res).__name__}, not an object")
        for k, types in fields.items():
            v = res.get(k)
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                self._bad(f"{op} result field {k!r} is {type(v).__name__}")
        return res

    def _data(self, op: str, res: dict, asked: int) -> bytes:
        """The bytes of a chunk reply, refused when over `asked` (checked before decoding)."""
        text = res["data"]
        if len(text) > 4 * ((asked + 2) // 3):
            self._bad(f"{op} returned {len(text)} base64 characters for at most {asked} bytes")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            self._bad(f"{op} returned data that is not base64 ({exc})")
        if len(data) > asked:
            self._bad(f"{op} returned {len(data)} bytes for at most {asked}")
        return data

    # -- metadata ---------------------------------------------------------------------------------
    def stat(self, path: str) -> Entry:
        res = self._call("fs_stat", {"path": path}, {"type": (str,), "target": (str, type(None))})
        try:
            return _entry(path, path.rstrip("/").rsplit("/", 1)[-1] or "/", res["type"], res.get("size"),
                          res.get("mode"), res.get("mtime"), res["target"])
        except ValueError as exc:
            return self._bad(f"fs_stat: {exc}")

    def list(self, path: str, depth: int = 1) -> list[Entry]:
        """Entries under `path`, `depth` levels down (1: its children), at most MAX_ENTRIES of at most MAX_BYTES
        (list_page's order and bounds; the rest is left out)."""
        out: list[Entry] = []
        cursor, used = None, 0
        while True:
            page = self.list_page(path, depth, MAX_ENTRIES - len(out), MAX_BYTES - used, cursor)
            out += page.entries
            cursor, used = page.next_cursor, used + page.bytes
            if cursor is None or len(out) >= MAX_ENTRIES or used >= MAX_BYTES:
                return out

    def list_page(self, path: str, depth: int = 1, limit: int = PAGE_ENTRIES, max_bytes: int = PAGE_BYTES,
                  cursor: str | None = None) -> Page:
        """One page of the entries under `path`, `depth` levels down, depth first in name order (a directory, then
        what is in it), from after `cursor` (a Page's next_cursor): at most `limit` entries and `max_bytes` of
        them (entry_bytes; at least one entry). Entries whose path would pass MAX_PATH bytes are left out and
        counted in `skipped` (nothing beneath them is listed)."""
        resume, descend = decode_cursor(cursor, depth)
        entries: list[Entry] = []
        used = skipped = 0
        last = cursor
        walk = self._walk(path, (), 1, depth, resume, descend)
        try:
            for entry, rel, down in walk:
                size = entry_bytes(entry) if entry is not None else len(rel[-1]) + ENTRY_OVERHEAD
                if (entries or skipped) and (len(entries) >= limit or used + size > max_bytes):
                    return Page(entries, last, skipped, used)
                if entry is None:
                    skipped += 1
                else:
                    entries.append(entry)
                used += size
                last = encode_cursor(rel, down)
        finally:
            walk.close()
        return Page(entries, None, skipped, used)

    def _walk(self, d: str, rel: tuple[str, ...], level: int, depth: int, resume: tuple[str, ...],
              descend: bool) -> Iterator[tuple[Entry | None, tuple[str, ...], bool]]:
        """(entry or None when its path is too long, its path relative to the root, whether the walk goes into it)
        depth first, after the entry `resume` names (and into it if `descend`)."""
        after = ""
        if resume:
            head, rest = resume[0], resume[1:]
            if (rest or descend) and level < depth:
                yield from self._walk(join(d, head), rel + (head,), level + 1, depth, rest, descend)
            after = head
        for e in self._list_dir(d, after):
            if len(e.path.encode("utf-8", "surrogateescape")) > MAX_PATH:
                yield None, rel + (e.name,), False
                continue
            down = e.type == "dir" and level < depth
            yield e, rel + (e.name,), down
            if down:
                yield from self._walk(e.path, rel + (e.name,), level + 1, depth, (), False)

    def _list_dir(self, path: str, after: str = "") -> Iterator[Entry]:
        while True:
            res = self._call("fs_list", {"path": path, "after": after, "limit": LIST_PAGE},
                             {"entries": (list,), "more": (bool,)})
            page = res["entries"]
            if len(page) > LIST_PAGE:
                self._bad(f"fs_list returned {len(page)} entries for at most {LIST_PAGE}")
            for e in page:
                entry = self._list_entry(path, e, after)
                after = entry.name
                yield entry
            if not res["more"] or not page:
                return

    def _list_entry(self, parent: str, e: Any, after: str) -> Entry:
        try:
            if not isinstance(e, list) or len(e) != 5:
                raise ValueError("an entry is not [name, type, size, mode, mtime]")
            name = check_name(e[0])
            if name <= after:
                raise ValueError(f"entries out of order ({name[:80]!r} after {after[:80]!r})")
            return _entry(join(parent, name), name, e[1], e[2], e[3], e[4])
        except ValueError as exc:
            return self._bad(f"fs_list: {exc}")

    def exists(self, path: str) -> bool:
        from forkd.vmm.agent_replies import AgentError

        try:
            self.stat(path)
        except AgentError as exc:
            if exc.error.get("type") in ("FileNotFoundError", "NotADirectoryError"):
                return False
            raise
        return True

    def remove(self, path: str, recursive: bool = False) -> None:
        self._call("fs_remove", {"path": path, "recursive": recursive}, {})

    def rename(self, src: str, dst: str) -> None:
        self._call("fs_rename", {"src": src, "dst": dst}, {})

    def mkdir(self, path: str, parents: bool = True, mode: int = 0o755) -> bool:
        return self._call("fs_mkdir", {"path": path, "parents": parents, "mode": mode}, {"created": (bool,)})["created"]

    def chmod(self, path: str, mode: int) -> None:
        self._call("fs_chmod", {"path": path, "mode": mode}, {})

    # -- contents ---------------------------------------------------------------------------------
    def read(self, path: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """The file's bytes, `chunk` at a time (any size; never held whole)."""
        chunk = max(1, min(chunk, MAX_CHUNK))
        offset = 0
        while True:
            res = self._call("fs_read", {"path": path, "offset": offset, "length": chunk},
                             {"data": (str,), "eof": (bool,)})
            data = self._data("fs_read", res, chunk)
            offset += len(data)
            if data:
                yield data
            if res["eof"] or not data:
                return

    def write(self, path: str, chunks: Iterable[bytes], mode: int = 0o644, mkdir: bool = True) -> int:
        """Write `chunks` to `path` (a temporary file renamed over it at the end: readers never see half a
        file; on any failure the temporary is removed). Returns the bytes written."""
        token = secrets.token_hex(8)
        offset = 0
        try:
            for piece, last in _rechunk(chunks, CHUNK):
                self._call("fs_write", {"path": path, "upload": token, "offset": offset, "done": last, "mode": mode,
                                        "mkdir": mkdir, "data": base64.b64encode(piece).decode()}, {})
                offset += len(piece)
        except BaseException:
            if self.client.violation is None:
                try:
                    self._call("fs_abort", {"path": path, "upload": token}, {})
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    pass
            raise
        return offset

    # -- tar streams ------------------------------------------------------------------------------
    def tar_read(self, path: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """A tar stream of `path` made in the guest, passed on only as far as it answers that question: every
        member beneath the path's last component (forkd.base.taranswer), else InvalidInput mid-stream."""
        return answer_only(self._tar_chunks(path, chunk), top_name(path))

    def _tar_chunks(self, path: str, chunk: int) -> Iterator[bytes]:
        chunk = max(1, min(chunk, MAX_CHUNK))
        sid = self._call("fs_tar_open", {"path": path, "mode": "read"}, {"stream": (int,)})["stream"]
        try:
            while True:
                res = self._call("fs_stream_read", {"stream": sid, "length": chunk}, {"data": (str,), "eof": (bool,)})
                data = self._data("fs_stream_read", res, chunk)
                if data:
                    yield data
                if res["eof"] or not data:
                    return
        finally:
            if self.client.violation is None:
                self._call("fs_stream_close", {"stream": sid, "wait": 5}, {})

    def tar_write(self, dest: str, chunks: Iterable[bytes]) -> int:
        """Extract a tar stream into the guest directory `dest` (created if missing). Returns the bytes sent."""
        from forkd.vmm.agent_replies import AgentError

        sid = self._call("fs_tar_open", {"path": dest, "mode": "write"}, {"stream": (int,)})["stream"]
        sent = 0
        try:
            for piece, _ in _rechunk(chunks, CHUNK):
                self._call("fs_stream_write", {"stream": sid, "data": base64.b64encode(piece).decode()}, {})
                sent += len(piece)
        except BaseException:
            if self.client.violation is None:
                try:
                    self._call("fs_stream_close", {"stream": sid, "wait": 5}, {})
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    pass
            raise
        res = self._call("fs_stream_close", {"stream": sid}, {"error": (str, type(None))})
        if res["error"]:
            raise AgentError("fs_tar", {"type": "RequestError",
                                        "message": f"extracting into {dest}: {res['error'][:MAX_ERROR]}"})
        return sent

    # -- watches ----------------------------------------------------------------------------------
    def watch_start(self, path: str, recursive: bool = False) -> tuple[int, str]:
        res = self._call("fs_watch_start", {"path": path, "recursive": recursive}, {"watch": (int,), "kind": (str,)})
        return res["watch"], res["kind"]

    def watch_poll(self, watch: int) -> tuple[list[dict], bool]:
        """(events, overflow): each event {"type", "name"} (name relative to the watched directory)."""
        res = self._call("fs_watch_poll", {"watch": watch, "limit": MAX_EVENTS},
                         {"events": (list,), "more": (bool,), "overflow": (bool,)})
        if len(res["events"]) > MAX_EVENTS:
            self._bad(f"fs_watch_poll returned {len(res['events'])} events for at most {MAX_EVENTS}")
        out = []
        for ev in res["events"]:
            if (not isinstance(ev, list) or len(ev) != 2 or ev[0] not in EVENTS or not isinstance(ev[1], str)
                    or len(ev[1]) > MAX_PATH or "\0" in ev[1]):
                self._bad("fs_watch_poll returned an event that is not [type, name]")
            out.append({"type": ev[0], "name": ev[1]})
        return out, res["overflow"]

    def watch_stop(self, watch: int) -> None:
        self._call("fs_watch_stop", {"watch": watch}, {})


@dataclass(frozen=True)
class Page:
    """One page of a listing: `next_cursor` resumes after it (None: the listing is complete)."""

    entries: list[Entry]
    next_cursor: str | None
    skipped: int = 0  # entries left out: their path would pass MAX_PATH
    bytes: int = 0  # what the page cost its byte budget (entry_bytes, and the entries skipped)


def entry_bytes(e: Entry) -> int:
    """What an entry costs a listing's byte budget: its path, name and target, plus the fields around them."""
    return len(e.path) + len(e.name) + len(e.target or "") + ENTRY_OVERHEAD


def encode_cursor(rel: tuple[str, ...], descend: bool) -> str:
    """An opaque cursor: where a listing resumes (after the entry `rel`, going into it first if `descend`)."""
    raw = ("d" if descend else "f") + "/".join(rel)
    return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogateescape")).decode()


def decode_cursor(cursor: str | None, depth: int) -> tuple[tuple[str, ...], bool]:
    """A cursor from a caller (untrusted): its path components, each one name, at most `depth` of them."""
    if not cursor:
        return (), False
    try:
        if len(cursor) > MAX_CURSOR:
            raise ValueError(f"over {MAX_CURSOR} characters")
        raw = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8", "surrogateescape")
        if raw[:1] not in ("d", "f"):
            raise ValueError("not one this listing made")
        rel = tuple(check_name(n) for n in raw[1:].split("/"))
        if len(rel) > depth:
            raise ValueError(f"deeper than depth {depth}")
    except (ValueError, UnicodeError, binascii.Error) as exc:
        raise InvalidInput(f"cursor {cursor[:40]!r}: {exc}",
                           hint="pass the next_cursor of the page before, with the same path and depth") from None
    return rel, raw[0] == "d"


def _entry(path: str, name: str, kind: Any, size: Any, mode: Any, mtime: Any, target: Any = None) -> Entry:
    if kind not in TYPES:
        raise ValueError(f"type {str(kind)[:40]!r} is not one of {sorted(TYPES)}")
    if target is not None and (len(target) > MAX_PATH or "\0" in target):
        raise ValueError("a symlink target that is not a path")
    return Entry(name, path, kind, _num(size, "size"), _num(mode, "mode", 0, 0o7777), _num(mtime, "mtime", -1e12, 1e12),
                 target)


def _rechunk(chunks: Iterable[bytes], size: int) -> Iterator[tuple[bytes, bool]]:
    """(piece, is_last) of at most `size` bytes each; one empty piece for empty input (so an empty file is made)."""
    buf = bytearray()
    pending: bytes | None = None
    for c in chunks:
        buf += c
        while len(buf) >= size:
            if pending is not None:
                yield pending, False
            pending = bytes(buf[:size])
            del buf[:size]
    if buf:
        if pending is not None:
            yield pending, False
        pending = bytes(buf)
    yield (pending if pending is not None else b""), True
