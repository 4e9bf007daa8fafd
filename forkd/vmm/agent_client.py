"""Host side of the guest-agent protocol (see forkd/guest/agent.py for the wire format).

The guest is untrusted: `eval`/`exec_code` run user code inside the agent process, and that code can write any
bytes to the agent's port. So every reply is bounded and checked before it is believed:

* a frame's length is checked against `MAX_FRAME` before anything is allocated, and its payload is read into one
  buffer of exactly that size (`recv_into`, no repeated concatenation); bytes that are not a frame, and frames that
  are not ours, count against a per-call budget;
* the JSON is parsed only after a linear scan shows its skeleton (what lies outside its strings) is small, which
  bounds nesting, containers and items; the parsed reply must be an object with the expected fields and types;
* outputs are cut to `MAX_OUTPUT` characters on the host and `read_file` returns at most `MAX_FILE` bytes.

Anything else is a `ProtocolViolation`: the connection is closed and the caller (the runtime) stops the child.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
import secrets
import struct
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from forkd.base.errors import ForkdError, InvalidInput, ProtocolViolation
from forkd.vmm.qmp import connect_unix

MAGIC = b"FKD1"
HEADER = 8  # MAGIC + 4-byte big-endian length
MAX_FRAME = 64 << 20  # largest reply payload the host reads (the agent's own limit for requests)
MAX_OUTPUT = 1 << 20  # characters of stdout, stderr or value kept from one exec / eval / exec_code
MAX_FILE = 16 << 20  # bytes read_file returns
MAX_STRINGS = 512  # JSON strings in one reply (an honest one has a few dozen)
MAX_SKELETON = 16 << 10  # bytes of a reply outside its strings (an honest one has a few hundred)
MAX_TEXT = 64 << 10  # characters kept of an agent error's message or traceback
CHUNK = 1 << 16
_STRING = re.compile(rb'"[^"]*"')
_NONE = type(None)

# the fields (and their types) every op's result must have; extra fields are allowed
RESULTS: dict[str, dict[str, tuple[type, ...]]] = {
    "ping": {"pong": (bool,)},
    "exec": {"stdout": (str,), "stderr": (str,), "exit_code": (int,), "timed_out": (bool,), "truncated": (bool,)},
    "eval": {"value": (str, _NONE), "stdout": (str,), "stderr": (str,), "error": (dict, _NONE)},
    "exec_code": {"value": (str, _NONE), "stdout": (str,), "stderr": (str,), "error": (dict, _NONE)},
    "write_file": {"path": (str,), "size": (int,)},
    "read_file": {"path": (str,), "data": (str,), "truncated": (bool,)},
    "forked": {"child_id": (str, _NONE), "hostname": (str,)},
    "fsfreeze": {},
}


class AgentError(ForkdError):
    """The agent answered with an error (bad request, or an exception while serving it)."""

    def __init__(self, op: str, error: dict):
        super().__init__(f"agent {op}: {error.get('type')}: {error.get('message')}")
        self.error = error


class AgentTimeout(ForkdError):
    pass


def skeleton(payload: bytes | bytearray) -> bytes:
    """What lies outside the JSON strings of `payload` (linear, C-speed scans). Escaped backslashes go first, then
    escaped quotes, so every remaining quote opens or closes a string. Raises ValueError when there are more
    than MAX_STRINGS strings (so the substitution stays cheap)."""
    flat = payload.replace(b"\\\\", b"").replace(b'\\"', b"")
    if flat.count(b'"') > 2 * MAX_STRINGS:
        raise ValueError(f"more than {MAX_STRINGS} strings")
    return _STRING.sub(b"", flat)


def parse_reply(payload: bytes | bytearray) -> dict:
    """Parse one reply payload; ValueError says why it is not a well-formed, bounded reply object."""
    if len(skel := skeleton(payload)) > MAX_SKELETON:
        raise ValueError(f"{len(skel)} bytes of JSON structure outside strings (at most {MAX_SKELETON})")
    try:
        reply = json.loads(payload)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(reply, dict):
        raise ValueError(f"a JSON {type(reply).__name__}, not an object")
    if not isinstance(reply.get("ok"), bool):
        raise ValueError("'ok' is not true or false")
    if not isinstance(reply.get("id"), (int, _NONE)) or isinstance(reply.get("id"), bool):
        raise ValueError("'id' is not an integer")
    if reply["ok"] and "result" not in reply:
        raise ValueError("no 'result'")
    if not reply["ok"]:
        check_error(reply.get("error"), "'error'")
    return reply


def check_error(err: Any, where: str) -> None:
    if not isinstance(err, dict) or not all(isinstance(err.get(k), str) for k in ("type", "message")):
        raise ValueError(f"{where} is not an object with string 'type' and 'message'")
    if not isinstance(err.get("traceback"), (str, _NONE)):
        raise ValueError(f"{where}.traceback is not a string")
    for k in ("message", "traceback"):
        if isinstance(err.get(k), str) and len(err[k]) > MAX_TEXT:
            err[k] = err[k][:MAX_TEXT] + " [cut by forkd]"


def check_result(op: str, result: Any, max_output: int = MAX_OUTPUT) -> Any:
    """The result of `op`, checked against RESULTS (ValueError if misshapen) and with its outputs capped."""
    fields = RESULTS.get(op)
    if fields is None:
        return result
    if not isinstance(result, dict):
        raise ValueError(f"{op} result is a JSON {type(result).__name__}, not an object")
    for name, types in fields.items():
        v = result.get(name)
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ValueError(f"{op} result field {name!r} is {type(v).__name__}, not "
                             f"{' or '.join(t.__name__ for t in types)}")
    if isinstance(result.get("error"), dict):
        check_error(result["error"], f"{op} result field 'error'")
    for name in ("stdout", "stderr", "value"):
        if isinstance(result.get(name), str) and len(result[name]) > max_output:
            result[name] = result[name][:max_output]
            result["truncated"] = True
    return result


class AgentClient:
    def __init__(self, path: Path, connect_timeout: float = 10.0, max_frame: int = MAX_FRAME):
        self.path = Path(path)
        self.max_frame = max_frame
        self.sock = connect_unix(self.path, connect_timeout)
        self._head = bytearray()  # bytes received but not yet part of a frame: at most one recv's worth
        self._scratch = bytearray(CHUNK)
        self._received = 0  # bytes received in the current call (budget: two frames and a chunk)
        self.violation: ProtocolViolation | None = None
        # ids unique across connections: a reply to an abandoned request of an earlier connection can
        # still arrive on this one and must not be taken for ours
        self._ids = itertools.count(secrets.randbits(48))
        self._lock = threading.Lock()

    def _violate(self, what: str) -> NoReturn:
        """The guest broke the protocol: close the connection for good and say so."""
        self.violation = ProtocolViolation(
            f"the guest agent on {self.path} broke the protocol: {what}",
            hint="code running in the guest can write anything to the agent's port; forkd treats this as the child "
                 "misbehaving and stops it: fork a new child (and keep replies within forkd's caps: "
                 f"{MAX_OUTPUT} characters of output, {MAX_FILE} bytes per read_file)")
        self.close()
        raise self.violation

    def send_raw(self, payload: bytes) -> None:
        """Send one frame with an arbitrary payload (tests use this to send malformed requests)."""
        self.sock.sendall(MAGIC + struct.pack(">I", len(payload)) + payload)

    def _recv_into(self, view: memoryview, deadline: float) -> int:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AgentTimeout(f"guest agent on {self.path} did not answer in time")
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(view)
        except TimeoutError:
            raise AgentTimeout(f"guest agent on {self.path} did not answer in time") from None
        if not n:
            raise ForkdError(f"guest agent connection {self.path} closed (VMM exited?)")
        self._received += n
        if self._received > 2 * self.max_frame + CHUNK:
            self._violate(f"sent over {2 * self.max_frame} bytes without answering")
        return n

    def _frame_length(self, deadline: float) -> int:
        """Skip to the next frame header (bytes before it are the tail of a frame an earlier disconnect cut) and
        return its payload length, refused above max_frame before anything is allocated."""
        while True:
            i = self._head.find(MAGIC)
            if i >= 0 and len(self._head) >= i + HEADER:
                (n,) = struct.unpack_from(">I", self._head, i + 4)
                del self._head[:i + HEADER]
                if n > self.max_frame:
                    self._violate(f"announced a frame of {n} bytes (the host reads at most {self.max_frame})")
                return n
            if i < 0:
                del self._head[:-3]
            k = self._recv_into(memoryview(self._scratch), deadline)
            self._head += memoryview(self._scratch)[:k]

    def _read_frame(self, deadline: float) -> dict:
        n = self._frame_length(deadline)
        buf = bytearray(n)  # the whole payload, allocated once
        have = min(n, len(self._head))
        buf[:have] = self._head[:have]
        del self._head[:have]
        view = memoryview(buf)
        while have < n:
            have += self._recv_into(view[have:], deadline)
        try:
            return parse_reply(buf)
        except ValueError as exc:
            self._violate(f"sent a malformed reply: {exc}")

    def call_raw(self, op: str, args: dict | None = None, timeout: float = 30.0) -> dict:
        with self._lock:
            if self.violation is not None:
                raise self.violation
            rid = next(self._ids)
            self.send_raw(json.dumps({"id": rid, "op": op, "args": args or {}}).encode())
            deadline = time.monotonic() + timeout
            self._received = 0
            while True:
                reply = self._read_frame(deadline)
                if reply.get("id") == rid:
                    return reply

    def call(self, op: str, args: dict | None = None, timeout: float = 30.0, max_output: int = MAX_OUTPUT) -> Any:
        reply = self.call_raw(op, args, timeout)
        if not reply["ok"]:
            raise AgentError(op, reply["error"])
        try:
            return check_result(op, reply["result"], max_output)
        except ValueError as exc:
            with self._lock:
                self._violate(f"sent a misshapen reply: {exc}")

    # convenience wrappers -------------------------------------------------------------
    def ping(self, timeout: float = 10.0) -> dict:
        return self.call("ping", timeout=timeout)

    def exec(self, argv: list[str], env: dict | None = None, cwd: str | None = None, stdin: str | None = None,
             timeout: float | None = None, max_output: int | None = None) -> dict:
        """Run argv in the guest. Output over `max_output` (default and ceiling: MAX_OUTPUT) is cut."""
        cap = min(max_output or MAX_OUTPUT, MAX_OUTPUT)
        args: dict[str, Any] = {"argv": argv, "max_output": cap}
        for k, v in (("env", env), ("cwd", cwd), ("stdin", stdin), ("timeout", timeout)):
            if v is not None:
                args[k] = v
        return self.call("exec", args, timeout=(timeout or 300) + 10, max_output=cap)

    def eval(self, code: str, timeout: float = 60.0) -> dict:
        return self.call("eval", {"code": code, "max_output": MAX_OUTPUT}, timeout=timeout)

    def exec_code(self, code: str, timeout: float = 300.0) -> dict:
        return self.call("exec_code", {"code": code, "max_output": MAX_OUTPUT}, timeout=timeout)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> dict:
        return self.call("write_file", {"path": path, "data": base64.b64encode(data).decode(), "mode": mode})

    def read_file(self, path: str) -> bytes:
        """A guest file's bytes; one over MAX_FILE is refused (InvalidInput), never read whole onto the host."""
        res = self.call("read_file", {"path": path, "max_bytes": MAX_FILE})
        if len(res["data"]) > 4 * (MAX_FILE // 3 + 1):
            with self._lock:
                self._violate(f"read_file returned {len(res['data'])} base64 characters for at most {MAX_FILE} bytes")
        try:
            data = base64.b64decode(res["data"], validate=True)
        except (binascii.Error, ValueError) as exc:
            with self._lock:
                self._violate(f"read_file returned data that is not base64 ({exc})")
        if res["truncated"]:
            raise InvalidInput(f"guest file {path} is larger than {MAX_FILE} bytes, the most read_file returns",
                               hint="copy it out in parts (e.g. exec 'split -b 8M FILE FILE.part-' and read each "
                                    "part), or compress it in the guest first")
        return data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
