"""A local HTTP server that answers 503 ("draining") before it answers: for the clients' retry tests, no VMs."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Draining(http.server.BaseHTTPRequestHandler):
    """Answers 503 to the first `busy` requests of each method and path, then 200 with `answers[path]` (JSON `[]`
    by default). `seen[(method, path)]` counts the requests; reset `seen` and `answers` on the class per test."""

    busy = 1
    answers: dict[str, tuple[str, bytes]] = {}
    seen: dict[tuple[str, str], int] = {}

    def _answer(self) -> None:
        path = self.path.split("?")[0]
        n = self.seen[self.command, path] = self.seen.get((self.command, path), 0) + 1
        kind, body = ("application/json", b'{"detail": "draining", "hint": "retry"}')
        if n > self.busy:
            kind, body = self.answers.get(path, ("application/json", b"[]"))
        self.send_response(503 if n <= self.busy else 200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[Draining]) -> Iterator[str]:
    """Serve `handler` on a free loopback port (its counters reset); yields the base URL."""
    handler.seen, handler.answers = {}, {}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        srv.server_close()
