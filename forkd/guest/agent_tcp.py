"""The guest agent's TCP relay ops (stdlib only): the host reaches a TCP server in the guest through the agent's
port, so a child without a network device still has ports the daemon can relay (forkd.core.relay).

``tcp_open {port}`` connects to the guest's own loopback (127.0.0.1, then ::1) and returns a stream id;
``tcp_read {stream, max_bytes, wait}`` returns what the server sent (base64, at most max_bytes, waiting up to
`wait` seconds for some) and whether it closed its side; ``tcp_write {stream, data, eof}`` sends bytes (and shuts
the writing side on eof); ``tcp_close {stream}`` ends it. At most TCP_STREAMS streams are open at once; one no op
touched for TCP_IDLE seconds is closed when the next one opens (a host that went away leaves none for long).
"""

import base64
import binascii
import os
import select
import socket
import threading
import time

from agent_base import RequestError

TCP_STREAMS = 64
TCP_IDLE = 600.0
TCP_CHUNK_MAX = 1 << 20
TCP_WAIT_MAX = 60.0
TCP_OPEN_TIMEOUT = 10.0
TCP_STREAMS_OPEN = {}  # id -> {"sock", "touched", "lock"}
_LOCK = threading.Lock()


def _reap_idle(now):
    for sid, st in list(TCP_STREAMS_OPEN.items()):
        if now - st["touched"] > TCP_IDLE:
            TCP_STREAMS_OPEN.pop(sid, None)
            st["sock"].close()


def _port(args):
    port = args.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise RequestError("'port' must be an integer from 1 to 65535")
    return port


def op_tcp_open(args):
    """A stream to the guest's `port` on its loopback (IPv4, else IPv6)."""
    port = _port(args)
    with _LOCK:
        _reap_idle(time.monotonic())
        if len(TCP_STREAMS_OPEN) >= TCP_STREAMS:
            raise RequestError(f"{TCP_STREAMS} relayed TCP streams are open already; close one first")
    last = None
    for host in ("127.0.0.1", "::1"):
        try:
            sock = socket.create_connection((host, port), timeout=TCP_OPEN_TIMEOUT)
            break
        except OSError as exc:
            last = exc
    else:
        raise ConnectionRefusedError(f"nothing answers on port {port} in the guest ({last})")
    sock.settimeout(None)
    sid = os.urandom(8).hex()
    with _LOCK:
        TCP_STREAMS_OPEN[sid] = {"sock": sock, "touched": time.monotonic(), "lock": threading.Lock()}
    return {"stream": sid}


def _stream(args):
    with _LOCK:
        st = TCP_STREAMS_OPEN.get(args.get("stream"))
    if st is None:
        raise RequestError(f"no TCP stream {args.get('stream')!r} (closed, or idle too long)")
    st["touched"] = time.monotonic()
    return st


def op_tcp_read(args):
    """What the server sent, up to `max_bytes`, after waiting at most `wait` seconds for some; eof once it closed."""
    st = _stream(args)
    n = args.get("max_bytes", 65536)
    wait = args.get("wait", 10.0)
    if not isinstance(n, int) or not 1 <= n <= TCP_CHUNK_MAX:
        raise RequestError(f"'max_bytes' must be an integer from 1 to {TCP_CHUNK_MAX}")
    if not isinstance(wait, (int, float)) or not 0 <= wait <= TCP_WAIT_MAX:
        raise RequestError(f"'wait' must be from 0 to {TCP_WAIT_MAX:g} seconds")
    ready, _, _ = select.select([st["sock"]], [], [], wait)
    if not ready:
        return {"data": "", "eof": False}
    try:
        data = st["sock"].recv(n)
    except OSError:
        data = b""
    st["touched"] = time.monotonic()
    return {"data": base64.b64encode(data).decode(), "eof": not data}


def op_tcp_write(args):
    """Send `data` (base64) to the server; `eof` then shuts the stream's writing side."""
    st = _stream(args)
    data = args.get("data", "")
    if not isinstance(data, str) or len(data) > 4 * (TCP_CHUNK_MAX // 3 + 1):
        raise RequestError(f"'data' must be base64 of at most {TCP_CHUNK_MAX} bytes")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("'data' is not base64") from None
    with st["lock"]:
        st["sock"].sendall(raw)
        if args.get("eof"):
            st["sock"].shutdown(socket.SHUT_WR)
    st["touched"] = time.monotonic()
    return {"sent": len(raw)}


def op_tcp_close(args):
    with _LOCK:
        st = TCP_STREAMS_OPEN.pop(args.get("stream"), None)
    if st is not None:
        st["sock"].close()
    return {"closed": st is not None}

