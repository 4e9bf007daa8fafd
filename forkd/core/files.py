"""Files in a running child: the core-level doors to forkd.vmm.agent_files over the child's agent.

`open_files(rt, id)` yields an AgentFiles on one agent connection and turns the guest's file errors into forkd's
(404 for a missing path, 409 for one that exists or is not empty, 400 for bad arguments or permissions).
`stream(...)` runs a generator on its own connection and raises the first chunk's error before anything is
sent, so an HTTP route can still answer 404; `watch(...)` polls a guest watch, one short connection per poll,
so other calls to the child interleave with a long watch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound
from forkd.vmm.agent_files import MAX_CURSOR, PAGE_BYTES, PAGE_ENTRIES, AgentFiles
from forkd.vmm.agent_replies import AgentError

__all__ = ["MAX_CURSOR", "PAGE_BYTES", "PAGE_ENTRIES", "guest_error", "open_files", "stream", "watch"]

NOT_FOUND = {"FileNotFoundError", "NotADirectoryError"}
CONFLICT = {"FileExistsError", "IsADirectoryError"}
BAD = {"RequestError", "PermissionError", "ValueError", "TypeError"}
KEEPALIVE = 10.0  # seconds between keepalive events of an idle watch


def guest_error(exc: AgentError, what: str) -> ForkdError:
    typ, msg = exc.error.get("type"), exc.error.get("message")
    if typ in NOT_FOUND:
        return NotFound(f"{what}: {msg}", hint="check the path in the sandbox (forkd exec ID -- ls -la DIR)")
    if typ in CONFLICT or (typ == "OSError" and "not empty" in str(msg)):
        return Conflict(f"{what}: {msg}", hint="remove it first, or pass recursive for a directory")
    if typ in BAD:
        return InvalidInput(f"{what}: {msg}")
    return ForkdError(f"{what}: {typ}: {msg}")


@contextlib.contextmanager
def open_files(rt: Any, child_id: str, what: str = "") -> Iterator[AgentFiles]:
    """AgentFiles on one connection to `child_id`'s agent; guest file errors become forkd errors."""
    try:
        with rt.agent(child_id) as a:
            yield AgentFiles(a)
    except AgentError as exc:
        raise guest_error(exc, what or f"child {child_id}") from exc


def stream(rt: Any, child_id: str, what: str, make: Callable[[AgentFiles], Iterator[bytes]]) -> Iterator[bytes]:
    """`make(files)`'s chunks on one connection, the first one pulled now (its errors raise here)."""
    def chunks() -> Iterator[bytes]:
        with open_files(rt, child_id, what) as f:
            yield from make(f)

    it = chunks()
    first = next(it, None)

    def rest() -> Iterator[bytes]:
        try:
            if first:
                yield first
            yield from it
        finally:
            it.close()
    return rest()


def watch(rt: Any, child_id: str, path: str, recursive: bool = False, interval: float = 0.25,
          duration: float | None = None) -> Iterator[dict]:
    """Events under guest directory `path` as dicts {"type", "name"} (plus "started", "overflow" and "keepalive"),
    until `duration` seconds passed (None: until the consumer stops)."""
    with open_files(rt, child_id, path) as f:
        wid, kind = f.watch_start(path, recursive)
    end = None if duration is None else time.monotonic() + duration
    quiet_since = time.monotonic()
    try:
        yield {"type": "started", "name": path, "kind": kind}
        while end is None or time.monotonic() < end:
            with open_files(rt, child_id, path) as f:
                events, overflow = f.watch_poll(wid)
            if overflow:
                yield {"type": "overflow", "name": path}
            yield from events
            if events:
                quiet_since = time.monotonic()
                continue
            if time.monotonic() - quiet_since > KEEPALIVE:
                quiet_since = time.monotonic()
                yield {"type": "keepalive", "name": path}
            time.sleep(interval)
    finally:
        with contextlib.suppress(ForkdError), open_files(rt, child_id, path) as f:
            f.watch_stop(wid)
