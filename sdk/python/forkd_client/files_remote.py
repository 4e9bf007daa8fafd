"""Files of a sandbox through the daemon's API (forkd/api/routes_files.py), streamed both ways with httpx: a
download is read chunk by chunk as it arrives, an upload is sent from an iterator (chunked), a watch is an NDJSON
stream read line by line. Used by `sb.files` (forkd_client.files) and, through forkd.client.files_remote, by the
runtime's `forkd cp` to a daemon. Errors are forkd_client.errors kinds, as for every other call."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

import httpx

from forkd_client import files_wire as fw
from forkd_client.http import Call, SyncHttp, answer, quote, transport_error

CHUNK = 1 << 20
OCTETS = {"Content-Type": "application/octet-stream"}
MAX_LINE = 64 << 10  # bytes of one NDJSON line of a watch
MAX_ENTRIES = 100_000  # entries list() gathers, all pages together


def chunks_of(data: str | bytes | IO[bytes] | Iterable[bytes], size: int = CHUNK) -> Iterator[bytes]:
    """What an upload sends: a str (UTF-8), bytes, a binary file object (read `size` at a time) or an iterable."""
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for i in range(0, len(view), size):
            yield bytes(view[i:i + size])
        return
    if hasattr(data, "read"):
        while chunk := data.read(size):
            yield chunk
        return
    for chunk in data:
        yield bytes(chunk)


class RemoteFiles:
    """The files of sandbox `sandbox_id`, through `http` (a forkd_client Client, or any client with the same `_send`,
    `_http` and `endpoint`: the runtime's forkd.client.api.Client)."""

    def __init__(self, http: SyncHttp, sandbox_id: str):
        self.http, self.id = http, sandbox_id
        self.base = f"/v1/sandboxes/{quote(sandbox_id)}/files"

    def _call(self, method: str, sub: str, parse: Any = None, **kw: Any) -> Any:
        return self.http._send(Call(method, self.base + sub, parse=parse, **kw))

    @contextlib.contextmanager
    def _stream(self, method: str, sub: str, params: dict, content: Iterable[bytes] | None = None,
                timeout: float | None = None) -> Iterator[httpx.Response]:
        call = Call(method, self.base + sub, params=params)
        kw: dict[str, Any] = {"params": params}
        if content is not None:
            kw.update(content=content, headers=OCTETS)
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            with self.http._http.stream(method, self.base + sub, **kw) as r:
                if r.status_code >= 400:
                    r.read()
                    answer(call, r)  # raises the answer's error kind (forkd_client.http)
                yield r
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.http.endpoint, call.method, call.path) from exc

    # -- metadata ---------------------------------------------------------------------------------
    def list(self, path: str, depth: int = 1, max_entries: int = MAX_ENTRIES) -> list[fw.EntryInfo]:
        """Every entry under `path`, `depth` levels down (depth first, names in order), page after page, up to
        `max_entries` (list_page walks any number)."""
        out: list[fw.EntryInfo] = []
        cursor = None
        while len(out) < max_entries:
            page = self.list_page(path, depth, cursor=cursor)
            out += page.entries
            cursor = page.next_cursor
            if cursor is None:
                break
        return out[:max_entries]

    def list_page(self, path: str, depth: int = 1, limit: int | None = None,
                  cursor: str | None = None) -> fw.EntryList:
        """One page (at most `limit` entries, and what the daemon's byte budget allows) from after `cursor`."""
        params: dict[str, Any] = {"path": path, "depth": depth}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        return self._call("GET", "/list", params=params, parse=fw.EntryList.model_validate)

    def stat(self, path: str) -> fw.EntryInfo:
        return self._call("GET", "/stat", params={"path": path}, parse=fw.EntryInfo.model_validate)

    def exists(self, path: str) -> bool:
        return self._call("GET", "/exists", params={"path": path}, parse=lambda d: bool(d["exists"]))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._call("DELETE", "", params={"path": path, "recursive": str(recursive).lower()})

    def rename(self, src: str, dst: str) -> None:
        self._call("POST", "/rename", json={"src": src, "dst": dst})

    def mkdir(self, path: str, parents: bool = True, mode: int = 0o755) -> bool:
        return self._call("POST", "/mkdir", json={"path": path, "parents": parents, "mode": mode},
                          parse=lambda d: bool(d["created"]))

    def chmod(self, path: str, mode: int) -> None:
        self._call("POST", "/chmod", json={"path": path, "mode": mode})

    # -- contents ---------------------------------------------------------------------------------
    def read(self, path: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """The file's bytes as they arrive (a generator: the request is made on the first next())."""
        with self._stream("GET", "/content", {"path": path}) as r:
            yield from r.iter_bytes(chunk)

    def write(self, path: str, data: str | bytes | IO[bytes] | Iterable[bytes], mode: int = 0o644,
              mkdir: bool = True) -> int:
        with self._stream("PUT", "/content", {"path": path, "mode": mode, "mkdir": str(mkdir).lower()},
                          content=chunks_of(data)) as r:
            return int(json.loads(r.read())["bytes"])

    def tar_read(self, path: str, chunk: int = CHUNK) -> Iterator[bytes]:
        with self._stream("GET", "/archive", {"path": path}) as r:
            yield from r.iter_bytes(chunk)

    def tar_write(self, dest: str, chunks: Iterable[bytes]) -> int:
        with self._stream("PUT", "/archive", {"path": dest}, content=chunks_of(chunks)) as r:
            return int(json.loads(r.read())["bytes"])

    def watch(self, path: str, recursive: bool = False, timeout: float = 3600) -> Iterator[dict]:
        """Events under a guest directory (dicts: type, name) until `timeout` seconds passed."""
        params = {"path": path, "recursive": str(recursive).lower(), "timeout": timeout}
        with self._stream("GET", "/watch", params, timeout=httpx.Timeout(60.0, read=None)) as r:
            for line in r.iter_lines():
                if len(line) > MAX_LINE:
                    raise ValueError(f"a watch event of over {MAX_LINE} bytes")
                if line.strip():
                    yield json.loads(line)
