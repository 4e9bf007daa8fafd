"""A small HTTP/1.1 client for the CLI's calls to its daemon: one request per connection, the answer's body framed
by Content-Length, chunked transfer coding or the connection's close.

The standard library's http.client imports the email package and ssl when it is imported; this module imports
neither (ssl only for an https daemon, by the caller). The peer is a daemon, but its answer is still bounded where
a bound is cheap: the status line and headers (MAX_HEAD) and every chunk-size line.
"""

from __future__ import annotations

import socket
from typing import Any

MAX_HEAD = 64 << 10  # status line + headers
MAX_LINE = 8 << 10  # one header or chunk-size line
_PIECE = 64 << 10


class BadResponse(ConnectionError):
    """The daemon's answer is not HTTP as this client reads it (an OSError, as a broken connection is)."""


class Connection:
    """One request to a daemon on a unix socket (`unix`) or at host:port (TCP; `tls`: an ssl context)."""

    def __init__(self, timeout: float, *, unix: str | None = None, host: str | None = None, port: int = 80,
                 tls: Any = None):
        self.timeout, self.unix, self.host, self.port, self.tls = timeout, unix, host, port, tls
        self.sock: socket.socket | None = None

    def _open(self) -> socket.socket:
        if self.unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(self.unix)
            except OSError:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            except OSError:
                sock.close()
                raise
        return sock

    def request(self, method: str, target: str, body: str | bytes | None = None,
                headers: dict[str, str] | None = None) -> None:
        """Connect and send the request (Connection: close: the answer ends where the connection does, at most)."""
        data = body.encode() if isinstance(body, str) else body
        host = "localhost" if self.unix else f"[{self.host}]" if ":" in str(self.host) else str(self.host)
        host = host if self.unix else f"{host}:{self.port}"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if data is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(data or b'')}")
        self.sock = self._open()
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (data or b""))

    def getresponse(self) -> Response:
        assert self.sock is not None, "request() first"
        return Response(self.sock.makefile("rb"), head_only=False)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Response:
    """The status, headers (lower-case names) and body of one answer; read() or readline() the body."""

    def __init__(self, f: Any, head_only: bool):
        self._f, self._buf, self._left, self._done = f, b"", 0, False
        line = self._line(MAX_HEAD)
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise BadResponse(f"not an HTTP answer: {line[:80]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        size = len(line)
        while (line := self._line(MAX_LINE)) not in (b"\r\n", b"\n"):
            size += len(line)
            if size > MAX_HEAD or b":" not in line:
                raise BadResponse("the answer's headers are malformed or over 64 KiB")
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        if head_only or self.status in (204, 304) or 100 <= self.status < 200:
            self._mode = "none"
        elif "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in self.headers:
            self._mode, self._left = "length", _length(self.headers["content-length"])
        else:
            self._mode = "close"

    def _line(self, limit: int) -> bytes:
        line = self._f.readline(limit + 1)
        if not line:
            raise BadResponse("the daemon closed the connection before answering")
        if len(line) > limit:
            raise BadResponse("a line of the answer is too long")
        return line

    def _piece(self) -> bytes:
        """The next bytes of the body; b"" at its end."""
        if self._mode == "none" or self._done:
            return b""
        if self._mode == "close":
            return self._f.read1(_PIECE)
        if self._mode == "chunked" and self._left == 0:
            self._left = _length(self._line(MAX_LINE).split(b";", 1)[0], base=16)
            if self._left == 0:
                while self._line(MAX_LINE) not in (b"\r\n", b"\n"):  # trailers: read and dropped
                    pass
                self._done = True
                return b""
        if self._left == 0:
            self._done = True
            return b""
        data = self._f.read1(min(self._left, _PIECE))
        if not data:
            raise BadResponse("the answer was cut short")
        self._left -= len(data)
        if self._mode == "chunked" and self._left == 0:
            self._line(MAX_LINE)  # the CRLF after a chunk
        return data

    def read(self) -> bytes:
        """The rest of the body."""
        parts = [self._buf]
        while data := self._piece():
            parts.append(data)
        self._buf = b""
        return b"".join(parts)

    def readline(self) -> bytes:
        """The body's next line (with its newline; without one at the end); b"" at the end."""
        while b"\n" not in self._buf:
            data = self._piece()
            if not data:
                line, self._buf = self._buf, b""
                return line
            self._buf += data
        i = self._buf.index(b"\n") + 1
        line, self._buf = self._buf[:i], self._buf[i:]
        return line


def _length(text: str | bytes, base: int = 10) -> int:
    try:
        n = int(text.strip(), base)
    except ValueError:
        n = -1
    if n < 0:
        raise BadResponse(f"bad length in the answer: {text[:40]!r}")
    return n
