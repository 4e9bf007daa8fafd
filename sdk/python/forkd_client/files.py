"""`sb.files`: a sandbox's filesystem, E2B-style, streamed through the daemon (forkd_client.files_remote).

    sb.files.write("/root/a.txt", "hi")                 # str, bytes, a binary file object or an iterable of bytes
    sb.files.read("/root/a.txt")                        # "hi"; format="bytes" or format="stream" (an iterator)
    sb.files.list("/root", depth=2)                     # [EntryInfo(name, path, type, size, mode, mtime, target)]
    sb.files.list_page("/root", depth=32, cursor=None)  # one bounded page; .next_cursor resumes after it
    sb.files.exists("/root/a.txt"); sb.files.get_info("/root/a.txt")
    sb.files.make_dir("/root/d"); sb.files.rename("/root/a.txt", "/root/d/a.txt"); sb.files.remove("/root/d")
    h = sb.files.watch_dir("/root", on_event=print)     # events in a background thread
    h.get_new_events(); h.stop()

Uploads and downloads of any size are streamed (never held whole by the daemon). `AsyncFilesystem` is the same
with `await` (watch_dir is an async iterator there)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import IO, Any

from forkd_client.files_remote import RemoteFiles
from forkd_client.files_wire import EntryInfo, EntryList, WatchEvent

Data = str | bytes | IO[bytes] | Iterable[bytes]


class WatchHandle:
    """A running watch of a directory: events arrive in a background thread (to `on_event` if given)."""

    def __init__(self, events: Iterator[dict], on_event: Callable[[WatchEvent], Any] | None = None):
        self._events, self._on_event = events, on_event
        self._queue: queue.Queue[WatchEvent] = queue.Queue()
        self.kind: str | None = None
        self.error: BaseException | None = None
        self._stopped = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(60)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            for raw in self._events:
                if self._stopped:
                    break
                ev = WatchEvent.model_validate(raw)
                if ev.type == "started":
                    self.kind = ev.kind
                    self._started.set()
                elif ev.type != "keepalive":
                    self._queue.put(ev)
                    if self._on_event is not None:
                        self._on_event(ev)
        except BaseException as exc:  # noqa: BLE001 - kept for the caller (stop() / get_new_events())
            self.error = exc
        finally:
            self._started.set()
            close = getattr(self._events, "close", None)
            if close is not None:
                close()  # ends the HTTP stream: the daemon stops the guest's watch

    def get_new_events(self) -> list[WatchEvent]:
        """The events since the last call (never blocks)."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        """Stop delivering events; the stream ends at its next event or keepalive (within ~10 s)."""
        self._stopped = True


class Filesystem:
    """The files of one sandbox (`sb.files`)."""

    def __init__(self, sb: Any):
        self._sb = sb

    @property
    def _fs(self) -> RemoteFiles:
        return RemoteFiles(self._sb.controller, self._sb.id)

    def read(self, path: str, format: str = "text") -> str | bytes | Iterator[bytes]:
        """The file's content: format "text" (UTF-8), "bytes", or "stream" (an iterator of chunks)."""
        chunks = self._fs.read(path)
        if format == "stream":
            return chunks
        data = b"".join(chunks)
        return data if format == "bytes" else data.decode()

    def write(self, path: str, data: Data, mode: int = 0o644) -> EntryInfo:
        """Write (streamed; parents created) and return the new entry."""
        self._fs.write(path, data, mode)
        return self._fs.stat(path)

    def list(self, path: str, depth: int = 1) -> list[EntryInfo]:
        """Entries under `path`, `depth` levels down, depth first in name order (up to 100000: list_page pages on)."""
        return self._fs.list(path, depth)

    def list_page(self, path: str, depth: int = 1, limit: int | None = None, cursor: str | None = None) -> EntryList:
        """One page of the listing from after `cursor` (the page before's `next_cursor`; None when complete)."""
        return self._fs.list_page(path, depth, limit, cursor)

    def exists(self, path: str) -> bool:
        return self._fs.exists(path)

    def get_info(self, path: str) -> EntryInfo:
        return self._fs.stat(path)

    stat = get_info

    def remove(self, path: str, recursive: bool = True) -> None:
        """Remove a file, link or directory (with what is in it, unless recursive=False)."""
        self._fs.remove(path, recursive)

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        self._fs.rename(old_path, new_path)
        return self._fs.stat(new_path)

    def make_dir(self, path: str, mode: int = 0o755) -> bool:
        """Create a directory and its parents: True if made, False if it existed."""
        return self._fs.mkdir(path, True, mode)

    def chmod(self, path: str, mode: int) -> None:
        self._fs.chmod(path, mode)

    def watch_dir(self, path: str, on_event: Callable[[WatchEvent], Any] | None = None, recursive: bool = False,
                  timeout: float = 3600) -> WatchHandle:
        """Watch a directory: returns once the watch runs (`handle.kind`: inotify or poll)."""
        return WatchHandle(self._fs.watch(path, recursive, timeout), on_event)


class AsyncFilesystem:
    """`sb.files` of an AsyncSandbox: the same calls, run in a worker thread so the event loop never blocks."""

    def __init__(self, sb: Any):
        self._sb = sb

    def _sync(self) -> Filesystem:
        from forkd_client.api import Client

        ctrl = self._sb.controller
        sync = Client(at=ctrl.endpoint, retry=getattr(ctrl, "retry", None))
        return Filesystem(type("S", (), {"controller": sync, "id": self._sb.id}))

    async def _run(self, name: str, *args: Any, close: bool = True) -> Any:
        fs = self._sync()
        try:
            return await asyncio.to_thread(getattr(fs, name), *args)
        finally:
            if close:
                fs._sb.controller.close()

    async def read(self, path: str, format: str = "text") -> str | bytes:
        return await self._run("read", path, "bytes" if format == "stream" else format)

    async def write(self, path: str, data: Data, mode: int = 0o644) -> EntryInfo:
        return await self._run("write", path, data, mode)

    async def list(self, path: str, depth: int = 1) -> list[EntryInfo]:
        return await self._run("list", path, depth)

    async def exists(self, path: str) -> bool:
        return await self._run("exists", path)

    async def get_info(self, path: str) -> EntryInfo:
        return await self._run("get_info", path)

    async def remove(self, path: str, recursive: bool = True) -> None:
        return await self._run("remove", path, recursive)

    async def rename(self, old_path: str, new_path: str) -> EntryInfo:
        return await self._run("rename", old_path, new_path)

    async def make_dir(self, path: str, mode: int = 0o755) -> bool:
        return await self._run("make_dir", path, mode)

    async def chmod(self, path: str, mode: int) -> None:
        return await self._run("chmod", path, mode)

    async def watch_dir(self, path: str, recursive: bool = False, timeout: float = 3600) -> AsyncIterator[WatchEvent]:
        """Events as an async iterator (until `timeout` or the loop breaks)."""
        h = await self._run("watch_dir", path, None, recursive, timeout, close=False)
        try:
            while h._thread.is_alive() or not h._queue.empty():
                for ev in h.get_new_events():
                    yield ev
                await asyncio.sleep(0.1)
        finally:
            h.stop()
