"""Files of a sandbox in this process (LocalBackend's door: forkd.core.files over the child's agent), with the
same methods and results as forkd.client.files_remote.RemoteFiles (the daemon's door)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any

from forkd.client import files_wire as fw
from forkd.client.files_remote import chunks_of
from forkd.core import files as core_files


def _info(e: Any) -> fw.EntryInfo:
    return fw.EntryInfo(**e.to_dict())


class LocalFiles:
    """The files of child `child_id` of the runtime `rt`; each call opens its own agent connection."""

    def __init__(self, rt: Any, child_id: str):
        self.rt, self.id = rt, child_id

    def _open(self, what: str):
        return core_files.open_files(self.rt, self.id, what)

    def list(self, path: str, depth: int = 1) -> list[fw.EntryInfo]:
        with self._open(path) as f:
            return [_info(e) for e in f.list(path, depth)]

    def list_page(self, path: str, depth: int = 1, limit: int | None = None,
                  cursor: str | None = None) -> fw.EntryList:
        with self._open(path) as f:
            page = f.list_page(path, depth, limit or core_files.PAGE_ENTRIES, core_files.PAGE_BYTES, cursor)
        return fw.EntryList(entries=[_info(e) for e in page.entries], next_cursor=page.next_cursor,
                            skipped=page.skipped)

    def stat(self, path: str) -> fw.EntryInfo:
        with self._open(path) as f:
            return _info(f.stat(path))

    def exists(self, path: str) -> bool:
        with self._open(path) as f:
            return f.exists(path)

    def remove(self, path: str, recursive: bool = False) -> None:
        with self._open(path) as f:
            f.remove(path, recursive)

    def rename(self, src: str, dst: str) -> None:
        with self._open(src) as f:
            f.rename(src, dst)

    def mkdir(self, path: str, parents: bool = True, mode: int = 0o755) -> bool:
        with self._open(path) as f:
            return f.mkdir(path, parents, mode)

    def chmod(self, path: str, mode: int) -> None:
        with self._open(path) as f:
            f.chmod(path, mode)

    def read(self, path: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        return core_files.stream(self.rt, self.id, path, lambda f: f.read(path, chunk))

    def write(self, path: str, data: str | bytes | IO[bytes] | Iterable[bytes], mode: int = 0o644,
              mkdir: bool = True) -> int:
        with self._open(path) as f:
            return f.write(path, chunks_of(data), mode, mkdir)

    def tar_read(self, path: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        return core_files.stream(self.rt, self.id, path, lambda f: f.tar_read(path, chunk))

    def tar_write(self, dest: str, chunks: Iterable[bytes]) -> int:
        with self._open(dest) as f:
            return f.tar_write(dest, chunks_of(chunks))

    def watch(self, path: str, recursive: bool = False, timeout: float = 3600) -> Iterator[dict]:
        return core_files.watch(self.rt, self.id, path, recursive, duration=timeout)
