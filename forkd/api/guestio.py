"""The daemon's calls into guests run apart from its other routes, bounded per child and per client.

A call into a guest (a file op, a download, a watch, a process's wait or stdin, an exec) waits as long as the guest
takes to answer. On the server's default thread pool, a few slow guests would hold every thread and stall routes
that never touch a guest (`GET /v1/snapshots`). So these calls run on a pool of their own (FORKD_GUEST_IO_THREADS
threads), and each takes a slot first: at most FORKD_GUEST_IO_PER_CHILD in flight for one child and
FORKD_GUEST_IO_PER_CLIENT for one client; a streamed answer holds its slot until the stream ends. Past a limit the
call is refused at once with 429, a Retry-After header and a message naming the child (or the client), before a
thread or a guest is touched.

A client is a TCP peer's address, or a unix socket peer's process (SO_PEERCRED pid; its uid is the daemon's or
root's, already trusted): one caller opening many connections is still one client.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import StreamingResponse

from forkd.api.auth import client_of
from forkd.base.errors import Busy
from forkd.base.settings import settings

T = TypeVar("T")
RETRY_AFTER = 1  # seconds a refused caller is told to wait


class GuestIO:
    """Slots and threads for calls into guests (one per app)."""

    def __init__(self, threads: int | None = None, per_child: int | None = None, per_client: int | None = None):
        s = settings()
        self.threads = threads or s.guest_io_threads
        self.per_child = per_child or s.guest_io_per_child
        self.per_client = per_client or s.guest_io_per_client
        self.limiter = anyio.CapacityLimiter(self.threads)
        self._lock = threading.Lock()
        self._children: Counter[str] = Counter()
        self._clients: Counter[str] = Counter()

    def in_flight(self, child: str) -> int:
        with self._lock:
            return self._children[child]

    def acquire(self, child: str, client: str) -> None:
        """Take a slot for a call into `child` from `client`, or raise Busy (429) naming which limit was hit."""
        with self._lock:
            if self._children[child] >= self.per_child:
                raise Busy(f"child {child} already has {self._children[child]} guest calls in flight (at most "
                           f"{self.per_child}); retry in {RETRY_AFTER} s",
                           hint="fewer calls at once to this sandbox, or raise FORKD_GUEST_IO_PER_CHILD")
            if self._clients[client] >= self.per_client:
                raise Busy(f"client {client} already has {self._clients[client]} guest calls in flight (at most "
                           f"{self.per_client}); the call to child {child} was refused: retry in {RETRY_AFTER} s",
                           hint="fewer calls at once, or raise FORKD_GUEST_IO_PER_CLIENT")
            self._children[child] += 1
            self._clients[client] += 1

    def release(self, child: str, client: str) -> None:
        with self._lock:
            for counts, k in ((self._children, child), (self._clients, client)):
                counts[k] -= 1
                if counts[k] <= 0:
                    del counts[k]

    @contextlib.asynccontextmanager
    async def slot(self, child: str, request: Request) -> AsyncIterator[None]:
        client = client_of(request.scope)
        self.acquire(child, client)
        try:
            yield
        finally:
            self.release(child, client)

    async def run(self, child: str, request: Request, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the guest pool, holding a slot of `child` and of the caller."""
        async with self.slot(child, request):
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def respond(self, child: str, request: Request, make: Callable[[], Iterator[bytes]],
                      media_type: str) -> StreamingResponse:
        """A streamed answer of `make()`'s chunks (a blocking iterator, made and pulled on the guest pool), holding a
        slot until the stream ends or the client leaves. The first chunk is pulled now: its errors (a missing file:
        404) are answered before the response starts."""
        client = client_of(request.scope)
        self.acquire(child, client)
        held = _Held(self, child, client)
        try:
            held.it = await anyio.to_thread.run_sync(make, limiter=self.limiter)
            first = await anyio.to_thread.run_sync(next, held.it, _END, limiter=self.limiter)
        except BaseException:
            await held.close()
            raise
        return _GuestStream(held, self._chunks(held, first), media_type=media_type)

    async def _chunks(self, held: _Held, first: Any) -> AsyncIterator[bytes]:
        try:
            item = first
            while item is not _END:
                yield item
                item = await anyio.to_thread.run_sync(next, held.it, _END, limiter=self.limiter)
        finally:
            await held.close()


class _Held:
    """A stream's slot and its blocking iterator, given back once (by whichever of the stream's end, the response's
    end or an error comes first)."""

    def __init__(self, gate: GuestIO, child: str, client: str):
        self.gate, self.child, self.client = gate, child, client
        self.it: Iterator[bytes] | None = None
        self.done = False

    async def close(self) -> None:
        if self.done:
            return
        self.done = True
        with anyio.CancelScope(shield=True):
            close = getattr(self.it, "close", None)
            try:
                if close is not None:
                    await anyio.to_thread.run_sync(close, limiter=self.gate.limiter)
            finally:
                self.gate.release(self.child, self.client)


class _GuestStream(StreamingResponse):
    """A StreamingResponse that gives its slot back even when its body was never iterated (the client left
    before the first byte was sent)."""

    def __init__(self, held: _Held, content: AsyncIterator[bytes], media_type: str):
        super().__init__(content, media_type=media_type)
        self.held = held

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.held.close()


_END = object()
