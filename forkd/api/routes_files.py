"""Files in a sandbox: list, stat, exists, remove, rename, mkdir, chmod; streamed download and upload of
any size (chunked response; the request body goes to the guest chunk by chunk, never buffered whole); tar streams
of files and directories (`forkd cp`); and a watch of a directory streamed as NDJSON.

Every path is a path in the guest: these routes never read or write a path of the daemon's host. The work is done
by the service (forkd.service.Service, forkd.core.files)
over the child's agent (forkd.vmm.agent_files checks what the guest answers)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated

import anyio
import anyio.from_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse

from forkd.api.guestio import GuestIO
from forkd.client import files_wire as fw
from forkd.service import Service
from forkd.service import guest as bounds

TAGS = ["files"]
SandboxId = Annotated[str, PathParam(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                     description="a sandbox id")]
PATH = Query(..., min_length=1, max_length=4096, pattern=r"^/[^\x00]*$", description="an absolute path in the guest")
BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
TAR = {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}
NDJSON = {"application/x-ndjson": {"schema": fw.WatchEvent.model_json_schema()}}
RAW_BODY = {"requestBody": {"required": True, "content": BINARY}}


def build_files_router(s: Service, gate: GuestIO) -> APIRouter:
    """Every route calls into the guest on `gate`'s pool, within its per-child and per-client limits."""
    r = APIRouter()
    _metadata_routes(r, s, gate)
    _content_routes(r, s, gate)
    _watch_route(r, s, gate)
    return r


def _entry(e) -> fw.EntryInfo:
    return fw.EntryInfo(**e.to_dict())


def _metadata_routes(r: APIRouter, s: Service, gate: GuestIO) -> None:
    def files(id: str, path: str, op):
        def run():
            with s.open_files(id, path) as f:
                return op(f)
        return run

    @r.get("/v1/sandboxes/{id}/files/list", tags=TAGS)
    async def list_files(request: Request, id: SandboxId, path: str = PATH, depth: int = Query(1, ge=1, le=32),
                   limit: int = Query(bounds.PAGE_ENTRIES, ge=1, le=bounds.PAGE_ENTRIES,
                                      description="entries of this page at most"),
                   cursor: str | None = Query(None, min_length=1, max_length=bounds.MAX_CURSOR,
                                              description="the next_cursor of the page before")) -> fw.EntryList:
        """One page of the entries under a directory, `depth` levels down, depth first in name order (symlinks are
        listed, not followed): at most `limit` entries and a bounded number of bytes, whatever the guest's tree.
        `next_cursor` (passed back as `cursor`) resumes after it; null: the listing is complete."""
        page = await gate.run(id, request, files(id, path, lambda f: f.list_page(path, depth, limit,
                                                                                  bounds.PAGE_BYTES, cursor)))
        return fw.EntryList(entries=[_entry(e) for e in page.entries], next_cursor=page.next_cursor,
                            skipped=page.skipped)

    @r.get("/v1/sandboxes/{id}/files/stat", tags=TAGS)
    async def stat(request: Request, id: SandboxId, path: str = PATH) -> fw.EntryInfo:
        return _entry(await gate.run(id, request, files(id, path, lambda f: f.stat(path))))

    @r.get("/v1/sandboxes/{id}/files/exists", tags=TAGS)
    async def exists(request: Request, id: SandboxId, path: str = PATH) -> fw.Exists:
        return fw.Exists(path=path, exists=await gate.run(id, request, files(id, path, lambda f: f.exists(path))))

    @r.delete("/v1/sandboxes/{id}/files", status_code=204, tags=TAGS)
    async def remove(request: Request, id: SandboxId, path: str = PATH, recursive: bool = False) -> Response:
        """Remove a file, symlink or empty directory (a non-empty one: `recursive`; 409 without)."""
        await gate.run(id, request, files(id, path, lambda f: f.remove(path, recursive)))
        return Response(status_code=204)

    @r.post("/v1/sandboxes/{id}/files/rename", tags=TAGS)
    async def rename(request: Request, id: SandboxId, req: fw.RenameRequest) -> fw.PathResult:
        await gate.run(id, request, files(id, req.src, lambda f: f.rename(req.src, req.dst)))
        return fw.PathResult(path=req.dst)

    @r.post("/v1/sandboxes/{id}/files/mkdir", tags=TAGS)
    async def mkdir(request: Request, id: SandboxId, req: fw.MakeDirRequest) -> fw.MadeDir:
        made = await gate.run(id, request, files(id, req.path, lambda f: f.mkdir(req.path, req.parents, req.mode)))
        return fw.MadeDir(path=req.path, created=made)

    @r.post("/v1/sandboxes/{id}/files/chmod", tags=TAGS)
    async def chmod(request: Request, id: SandboxId, req: fw.ChmodRequest) -> fw.PathResult:
        await gate.run(id, request, files(id, req.path, lambda f: f.chmod(req.path, req.mode)))
        return fw.PathResult(path=req.path)


def _body_chunks(request: Request) -> Iterator[bytes]:
    """The request body as it arrives, for a worker thread (anyio.to_thread): never held whole."""
    body: AsyncIterator[bytes] = request.stream()
    while True:
        try:
            chunk = anyio.from_thread.run(body.__anext__)
        except StopAsyncIteration:
            return
        if chunk:
            yield chunk


def _content_routes(r: APIRouter, s: Service, gate: GuestIO) -> None:
    @r.get("/v1/sandboxes/{id}/files/content", tags=TAGS, response_class=StreamingResponse,
           responses={200: {"content": BINARY, "description": "the file's bytes, streamed"}})
    async def download(request: Request, id: SandboxId, path: str = PATH) -> StreamingResponse:
        """A guest file of any size, streamed (chunked) as the guest reads it."""
        return await gate.respond(id, request, lambda: s.stream_files(id, path, lambda f: f.read(path)),
                                  "application/octet-stream")

    @r.put("/v1/sandboxes/{id}/files/content", tags=TAGS, openapi_extra=RAW_BODY)
    async def upload(id: SandboxId, request: Request, path: str = PATH, mode: int = Query(0o644, ge=0, le=0o7777),
                     mkdir: bool = Query(True, description="create missing parent directories")) -> fw.Written:
        """The body (application/octet-stream, any size) becomes the guest file `path`, streamed to the guest
        chunk by chunk; it appears whole (renamed over `path`) once the last chunk is written."""
        def write() -> int:
            with s.open_files(id, path) as f:
                return f.write(path, _body_chunks(request), mode, mkdir)
        return fw.Written(path=path, bytes=await gate.run(id, request, write))

    @r.get("/v1/sandboxes/{id}/files/archive", tags=TAGS, response_class=StreamingResponse,
           responses={200: {"content": TAR, "description": "a tar stream of the file or directory"}})
    async def archive(request: Request, id: SandboxId, path: str = PATH) -> StreamingResponse:
        """A tar stream of a guest file or directory (its top entry named by the path's last component). It is
        made by the guest: extract it as untrusted input (`forkd cp` does)."""
        return await gate.respond(id, request, lambda: s.stream_files(id, path, lambda f: f.tar_read(path)),
                                  "application/x-tar")

    @r.put("/v1/sandboxes/{id}/files/archive", tags=TAGS, openapi_extra=RAW_BODY)
    async def extract(id: SandboxId, request: Request, path: str = PATH) -> fw.Written:
        """Extract the body (a tar stream) into the guest directory `path` (created if missing)."""
        def write() -> int:
            with s.open_files(id, path) as f:
                return f.tar_write(path, _body_chunks(request))
        return fw.Written(path=path, bytes=await gate.run(id, request, write))


def _watch_route(r: APIRouter, s: Service, gate: GuestIO) -> None:
    @r.get("/v1/sandboxes/{id}/files/watch", tags=TAGS, response_class=StreamingResponse,
           responses={200: {"content": NDJSON, "description": "one WatchEvent per line"}})
    async def watch(request: Request, id: SandboxId, path: str = PATH, recursive: bool = False,
                    timeout: float = Query(3600, gt=0, le=86400, description="seconds until the stream ends")) \
            -> StreamingResponse:
        """Events under a guest directory as NDJSON lines (WatchEvent), until `timeout` or the client leaves.
        The first line is {"type": "started", "kind": "inotify"|"poll"}."""
        # the first line is pulled before the response starts: a missing directory is a 404, not a broken stream
        return await gate.respond(id, request, lambda: _ndjson(s.watch(id, path, recursive,
                                                                                duration=timeout)),
                                  "application/x-ndjson")


def _ndjson(events: Iterator[dict]) -> Iterator[bytes]:
    try:
        for ev in events:
            yield (json.dumps(ev) + "\n").encode()
    finally:
        events.close()
