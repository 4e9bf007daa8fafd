"""The guest agent's replies, checked before they are believed (forkd.vmm.agent_client reads the frames): the JSON
is parsed only after a linear scan shows its skeleton (what lies outside its strings) is small, which bounds
nesting, containers and items; the parsed reply must be an object with the fields and types its op promises
(RESULTS); outputs are cut to MAX_OUTPUT characters, process output chunks and rows are checked field by field.
Anything else is a `ProtocolViolation` (raised by the client, which then closes the connection)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from forkd.base.errors import ForkdError

MAX_OUTPUT = 1 << 20  # characters of stdout, stderr or value kept from one exec / eval / exec_code
MAX_FILE = 16 << 20  # bytes read_file returns
MAX_STRINGS = 512  # JSON strings in one reply (an honest one has a few dozen)
MAX_SKELETON = 16 << 10  # bytes of a reply outside its strings (an honest one has a few hundred)
MAX_TEXT = 64 << 10  # characters kept of an agent error's message or traceback
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
    "proc_start": {"pid": (int,)},
    "proc_read": {"chunks": (list,), "done": (bool,), "exit_code": (int, _NONE)},
    "proc_write": {"written": (int,)},
    "proc_signal": {"pid": (int,), "sent": (bool,)},
    "proc_kill": {"pid": (int,), "sent": (bool,)},
    "proc_wait": {"process": (list,)},
    "proc_list": {"processes": (list,)},
}
MAX_READ = 1 << 20  # output bytes one proc_read asks for (the agent's own cap); the host checks it
STREAMS = ("stdout", "stderr")
ROW = (("pid", (int,)), ("running", (bool,)), ("exit_code", (int, _NONE)), ("started", (int, float)),
       ("pty", (bool,)), ("tag", (str, _NONE)), ("argv", (list,)))  # a process row of proc_list / proc_wait


@dataclass
class Output:
    """One proc_read: output chunks in the order the process wrote them, the last sequence number, and whether
    the process has ended (then exit_code: its code, or -N when a signal N killed it)."""
    chunks: list[tuple[str, bytes]]
    seq: int
    done: bool
    exit_code: int | None


def check_output(res: dict, after: int, max_bytes: int) -> Output:
    """A proc_read result's chunks, checked: [seq, stream, base64], seqs increasing past `after`, at most
    `max_bytes` decoded bytes in all; ValueError otherwise."""
    chunks, seq, total = [], after, 0
    for c in res["chunks"]:
        if not (isinstance(c, list) and len(c) == 3 and type(c[0]) is int and c[1] in STREAMS
                and isinstance(c[2], str)) or c[0] <= seq:
            raise ValueError("a proc_read chunk is not [increasing seq, 'stdout'|'stderr', base64]")
        try:
            data = base64.b64decode(c[2], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"a proc_read chunk is not base64 ({exc})") from None
        total += len(data)
        if total > max_bytes:
            raise ValueError(f"proc_read returned over {max_bytes} bytes")
        seq = c[0]
        chunks.append((c[1], data))
    return Output(chunks, seq, res["done"], res["exit_code"])


def check_row(row: Any) -> dict:
    """A process row, checked, as {pid, running, exit_code, started, pty, tag, argv}; ValueError otherwise."""
    if not isinstance(row, list) or len(row) != len(ROW):
        raise ValueError(f"a process row is not a list of {len(ROW)} items")
    for v, (name, types) in zip(row, ROW, strict=True):
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ValueError(f"a process row's {name!r} is {type(v).__name__}")
    if not all(isinstance(a, str) for a in row[-1]):
        raise ValueError("a process row's argv is not a list of strings")
    return {name: v for v, (name, _) in zip(row, ROW, strict=True)}


class AgentError(ForkdError):
    """The agent answered with an error (bad request, or an exception while serving it)."""

    def __init__(self, op: str, error: dict):
        super().__init__(f"agent {op}: {error.get('type')}: {error.get('message')}")
        self.error = error


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
    if not isinstance(err.get("exit_code"), (int, _NONE)) or isinstance(err.get("exit_code"), bool):
        raise ValueError(f"{where}.exit_code is not an integer")
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
