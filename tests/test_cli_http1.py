"""The CLI's HTTP client (forkd.cli.http1) reads each framing a server may choose (Content-Length, chunked, close),
line by line for streams, and refuses a malformed or oversized head instead of hanging or reading without bound.
No VM: the server is a loopback socket in this process writing exact bytes (the real daemon's framings are also
crossed end to end by tests/test_cli_remote.py and tests/test_cli_imports.py)."""

from __future__ import annotations

import socket
import threading

import pytest

from forkd.cli.http1 import MAX_HEAD, BadResponse, Connection


def answer(raw: bytes) -> tuple[Connection, list[bytes]]:
    """A connection to a one-shot server that reads the request head, writes `raw` and closes; the requests it
    received come in the list (once the answer was read)."""
    srv = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            got.append(data)
            conn.sendall(raw)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return Connection(10.0, host="127.0.0.1", port=srv.getsockname()[1]), got


def body_of(raw: bytes, lines: bool = False) -> tuple[int, bytes | list[bytes]]:
    conn, _ = answer(raw)
    conn.request("GET", "/x")
    resp = conn.getresponse()
    try:
        if lines:
            out = []
            while line := resp.readline():
                out.append(line)
            return resp.status, out
        return resp.status, resp.read()
    finally:
        conn.close()


def test_content_length_body_ends_at_its_length():
    status, body = body_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA")
    assert (status, body) == (200, b"hello")


def test_chunked_body_is_reassembled_and_split_into_lines_across_chunks():
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"4\r\n{\"a\"\r\n6;ext=1\r\n: 1}\n{\r\n8\r\n\"b\": 2}\n\r\n0\r\nTrailer: x\r\n\r\n")
    assert body_of(raw, lines=True) == (200, [b'{"a": 1}\n', b'{"b": 2}\n'])
    assert body_of(raw) == (200, b'{"a": 1}\n{"b": 2}\n')


def test_a_body_without_length_ends_with_the_connection():
    assert body_of(b"HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"detail\": \"no\"}") == \
        (404, b'{"detail": "no"}')


def test_no_content_has_no_body():
    assert body_of(b"HTTP/1.1 204 No Content\r\n\r\n") == (204, b"")


@pytest.mark.parametrize("raw,says", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
    (b"", "closed the connection"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "cut short"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "bad length"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 4000 + b"\r\n" * 1 + (b"X-Pad: " + b"a" * 4000 + b"\r\n") * 20
     + b"\r\n", "over 64 KiB"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD + 10) + b"\r\n\r\n", "too long"),
])
def test_a_malformed_answer_is_refused_by_name(raw, says):
    with pytest.raises(BadResponse, match=says):
        body_of(raw)


def test_the_request_names_host_length_and_close():
    conn, got = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    conn.request("POST", "/v1/x?a=1", body='{"k": 1}', headers={"Authorization": "Bearer t"})
    assert conn.getresponse().read() == b""
    conn.close()
    head = got[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"POST /v1/x?a=1 HTTP/1.1"
    assert {b"Connection: close", b"Content-Length: 8", b"Authorization: Bearer t"} <= set(head)
    assert any(h.startswith(b"Host: 127.0.0.1:") for h in head)
