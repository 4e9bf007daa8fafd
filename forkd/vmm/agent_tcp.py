"""Host side of the guest agent's TCP relay ops (forkd/guest/agent_tcp.py), over an AgentClient.

The guest is hostile: a reply of the wrong shape, a stream id that is not a short hex string, or more bytes than
asked for (checked on the base64 text before it is decoded) is a ProtocolViolation, so the runtime stops the
child (forkd.sandbox.child.ChildHandle.request). Chunks sent to the guest are at most CHUNK bytes.
"""

from __future__ import annotations

import base64
import binascii
import re

from forkd.vmm.agent_client import AgentClient

CHUNK = 1 << 16  # bytes per read or write request
STREAM_ID = re.compile(r"[0-9a-f]{1,32}")
OPEN_TIMEOUT = 30.0  # s the agent may take to connect (its own limit is 10 s; TCG guests answer slowly)
CALL_SLACK = 30.0  # s a loaded TCG guest may add to a long poll's `wait`


def _bad(client: AgentClient, op: str, what: str):
    client._violate(f"sent a misshapen {op} reply: {what}")


def tcp_open(client: AgentClient, port: int) -> str:
    """A stream to `port` on the guest's loopback; its id. AgentError when nothing answers there."""
    res = client.call("tcp_open", {"port": port}, timeout=OPEN_TIMEOUT)
    sid = res.get("stream") if isinstance(res, dict) else None
    if not isinstance(sid, str) or not STREAM_ID.fullmatch(sid):
        _bad(client, "tcp_open", "no stream id")
    return sid


def tcp_read(client: AgentClient, sid: str, wait: float, max_bytes: int = CHUNK) -> tuple[bytes, bool]:
    """(bytes the guest's server sent, at most `max_bytes`; whether it closed its side), waiting up to `wait` s."""
    res = client.call("tcp_read", {"stream": sid, "max_bytes": max_bytes, "wait": wait}, timeout=wait + CALL_SLACK)
    data, eof = (res.get("data"), res.get("eof")) if isinstance(res, dict) else (None, None)
    if not isinstance(data, str) or not isinstance(eof, bool):
        _bad(client, "tcp_read", "want {data: str, eof: bool}")
    if len(data) > 4 * ((max_bytes + 2) // 3):
        _bad(client, "tcp_read", f"{len(data)} base64 characters for at most {max_bytes} bytes")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        _bad(client, "tcp_read", "data that is not base64")
    return raw, eof


def tcp_write(client: AgentClient, sid: str, data: bytes, eof: bool = False) -> None:
    """Send `data` to the guest's server (in chunks of at most CHUNK bytes); `eof` shuts its reading side after."""
    view = memoryview(data)
    while True:
        part, view = view[:CHUNK], view[CHUNK:]
        client.call("tcp_write", {"stream": sid, "data": base64.b64encode(part).decode(), "eof": eof and not view},
                    timeout=120.0)
        if not view:
            return


def tcp_close(client: AgentClient, sid: str) -> None:
    client.call("tcp_close", {"stream": sid})
