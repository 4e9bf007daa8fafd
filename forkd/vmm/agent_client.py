"""Host side of the guest-agent protocol (see forkd/guest/agent.py for the wire format)."""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import struct
import threading
import time
from pathlib import Path
from typing import Any

from forkd.base.errors import ForkdError
from forkd.vmm.qmp import connect_unix

MAGIC = b"FKD1"


class AgentError(ForkdError):
    """The agent answered with an error (bad request, or an exception while serving it)."""

    def __init__(self, op: str, error: dict):
        super().__init__(f"agent {op}: {error.get('type')}: {error.get('message')}")
        self.error = error


class AgentTimeout(ForkdError):
    pass


class AgentClient:
    def __init__(self, path: Path, connect_timeout: float = 10.0):
        self.path = Path(path)
        self.sock = connect_unix(self.path, connect_timeout)
        self._buf = b""
        # ids unique across connections: a reply to an abandoned request of an earlier connection can
        # still arrive on this one and must not be taken for ours
        self._ids = itertools.count(secrets.randbits(48))
        self._lock = threading.Lock()

    def send_raw(self, payload: bytes) -> None:
        """Send one frame with an arbitrary payload (tests use this to send malformed requests)."""
        self.sock.sendall(MAGIC + struct.pack(">I", len(payload)) + payload)

    def _read_frame(self, deadline: float) -> dict:
        while True:
            i = self._buf.find(MAGIC)
            if i >= 0 and len(self._buf) >= i + 8:
                (n,) = struct.unpack(">I", self._buf[i + 4:i + 8])
                if len(self._buf) >= i + 8 + n:
                    payload = self._buf[i + 8:i + 8 + n]
                    self._buf = self._buf[i + 8 + n:]
                    try:
                        return json.loads(payload)
                    except ValueError:
                        continue  # a frame cut by an earlier disconnect: skip it
            elif i < 0:
                self._buf = self._buf[-3:]
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentTimeout(f"guest agent on {self.path} did not answer in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise AgentTimeout(f"guest agent on {self.path} did not answer in time") from None
            if not chunk:
                raise ForkdError(f"guest agent connection {self.path} closed (VMM exited?)")
            self._buf += chunk

    def call_raw(self, op: str, args: dict | None = None, timeout: float = 30.0) -> dict:
        with self._lock:
            rid = next(self._ids)
            self.send_raw(json.dumps({"id": rid, "op": op, "args": args or {}}).encode())
            deadline = time.monotonic() + timeout
            while True:
                reply = self._read_frame(deadline)
                if reply.get("id") == rid:
                    return reply

    def call(self, op: str, args: dict | None = None, timeout: float = 30.0) -> Any:
        reply = self.call_raw(op, args, timeout)
        if not reply.get("ok"):
            raise AgentError(op, reply.get("error") or {})
        return reply["result"]

    # convenience wrappers -------------------------------------------------------------
    def ping(self, timeout: float = 10.0) -> dict:
        return self.call("ping", timeout=timeout)

    def exec(self, argv: list[str], env: dict | None = None, cwd: str | None = None, stdin: str | None = None,
             timeout: float | None = None, max_output: int | None = None) -> dict:
        args: dict[str, Any] = {"argv": argv}
        for k, v in (("env", env), ("cwd", cwd), ("stdin", stdin), ("timeout", timeout),
                     ("max_output", max_output)):
            if v is not None:
                args[k] = v
        return self.call("exec", args, timeout=(timeout or 300) + 10)

    def eval(self, code: str, timeout: float = 60.0) -> dict:
        return self.call("eval", {"code": code}, timeout=timeout)

    def exec_code(self, code: str, timeout: float = 300.0) -> dict:
        return self.call("exec_code", {"code": code}, timeout=timeout)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> dict:
        return self.call("write_file", {"path": path, "data": base64.b64encode(data).decode(), "mode": mode})

    def read_file(self, path: str) -> bytes:
        return base64.b64decode(self.call("read_file", {"path": path})["data"])

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
