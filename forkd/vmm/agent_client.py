"""Host side of the guest-agent protocol (see forkd/guest/agent.py for the wire format).

The guest is untrusted: `eval`/`exec_code` run user code inside the agent process, and that code can write any
bytes to the agent's port. So every reply is bounded and checked before it is believed:

* a frame's length is checked against `MAX_FRAME` before anything is allocated, and its payload is read into one
  buffer of exactly that size (`recv_into`, no repeated concatenation); bytes that are not a frame, and frames that
  are not ours, count against a per-call budget;
* the JSON is parsed only after a linear scan shows its skeleton (what lies outside its strings) is small, which
  bounds nesting, containers and items; the parsed reply must be an object with the expected fields and types;
  outputs are cut to `MAX_OUTPUT` characters on the host (all three: forkd.vmm.agent_replies);
* `read_file` returns at most `MAX_FILE` bytes.

Anything else is a `ProtocolViolation`: the connection is closed and the caller (the runtime) stops the child.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import itertools
import json
import secrets
import select
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

from forkd.base.errors import ForkdError, InvalidInput, ProtocolViolation, Timeout
from forkd.vmm.agent_replies import (
    MAX_FILE,
    MAX_OUTPUT,
    MAX_READ,
    AgentError,
    Output,
    check_output,
    check_result,
    check_row,
    parse_reply,
)
from forkd.vmm.driver import VmmLost
from forkd.vmm.qmp import connect_unix
from forkd.vmm.unix_peer import accepted

MAGIC = b"FKD1"
HEADER = 8  # MAGIC + 4-byte big-endian length
MAX_FRAME = 64 << 20  # largest reply payload the host reads (the agent's own limit for requests)
CHUNK = 1 << 16


class AgentTimeout(Timeout):
    pass


_POOL: dict[str, AgentClient] = {}  # shared connections of this process, by socket path
_POOL_LOCK = threading.Lock()
_MAKING: dict[str, threading.Lock] = {}  # paths whose shared connection is being made
OWN_TIMEOUT = 0.5  # s: QEMU accepts a free connection (and a ping on it answers) well within this
OWN_POLL = 0.0005  # s between two looks at whether QEMU accepted our connection
QUIET_DRAIN = 0.1  # s: how long `quiet` waits for the VMM to read what was already sent


class AgentBusy(ForkdError):
    """Another host connection holds the child's agent (QEMU serves one at a time)."""


def _unread_by_peer(sock: socket.socket) -> int:
    """Bytes sent on a unix stream socket that its peer has not read yet (TIOCOUTQ)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0


class AgentClient:
    """One connection to a child's agent. Several threads may call at once: each sends its request and the one
    that holds the read turn reads frames for all, handing each reply to the caller whose id it carries (a frame
    cut by a timeout is resumed by the next reader). QEMU serves one host connection per port at a time, so
    callers that may overlap in one process (the daemon: a stream and the stdin sent to it) share one through
    `AgentClient.shared`."""

    def __init__(self, path: Path, connect_timeout: float = 10.0, max_frame: int = MAX_FRAME,
                 alive: Callable[[], bool] | None = None):
        self.path = Path(path)
        self.max_frame = max_frame
        self.sock = connect_unix(self.path, connect_timeout, alive)
        self._head = bytearray()  # bytes received but not yet part of a frame: at most one recv's worth
        self._scratch = bytearray(CHUNK)
        self._partial: list | None = None  # [payload buffer, bytes filled] of a frame a timeout interrupted
        self._received = 0  # bytes received since the last reply someone waited for (budget: two frames + a chunk)
        self.violation: ProtocolViolation | None = None
        self._dead: ForkdError | None = None
        self.served = False  # QEMU accepted this connection (it sent bytes on it, or the kernel said so)
        # ids unique across connections: a reply to an abandoned request of an earlier connection can
        # still arrive on this one and must not be taken for ours
        self._ids = itertools.count(secrets.randbits(48))
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._pending: dict[int, dict | None] = {}
        self._reading = False
        self._refs = 1

    @classmethod
    def shared(cls, path: Path, connect_timeout: float = 10.0) -> AgentClient:
        """This process's connection to the agent on `path` (made if there is none); `close()` releases it."""
        key = str(path)
        with _POOL_LOCK:
            making = _MAKING.setdefault(key, threading.Lock())
        with making:  # one connection per path: a second would wait behind the first in QEMU
            with _POOL_LOCK:
                client = _POOL.get(key)
                if client is not None and client.usable:
                    client._refs += 1
                    return client
            client = cls(path, connect_timeout)
            with _POOL_LOCK:
                _POOL[key] = client
                _MAKING.pop(key, None)
            return client

    @classmethod
    def owned(cls, path: Path, timeout: float = OWN_TIMEOUT) -> AgentClient:
        """This process's (shared) connection to the agent on `path`, known to be the one QEMU serves. QEMU serves
        one host connection at a time, until it closes it, and accepts no other meanwhile: another waits in its
        backlog, even one this process made earlier. So a connection is the served one when it is open and QEMU
        accepted it (it sent us bytes, or the kernel says its server end was accepted: forkd.vmm.unix_peer), which
        needs no round trip through the guest; where the kernel cannot say, it must answer a ping. Either within
        `timeout`, else `AgentBusy`: another connection holds the agent."""
        try:
            client = cls.shared(path, connect_timeout=timeout)
        except ForkdError as exc:  # a full backlog: connections that wait for the one QEMU serves (ours or not)
            if not isinstance(exc.__cause__, (BlockingIOError, TimeoutError)):
                raise
            raise AgentBusy(f"the agent on {path} is held by another connection (others wait in its backlog: "
                            f"{exc.__cause__})", hint="retry once the other client (another forkd process?) is "
                                                      "done") from exc
        deadline = time.monotonic() + timeout
        known = client._accepted_by(deadline)
        if known is None:  # the kernel cannot say: only the connection QEMU serves answers a ping
            try:
                client.ping(timeout=max(0.01, deadline - time.monotonic()))
                known = True
            except ForkdError:
                known = False
        if not known:
            client.close()
            raise AgentBusy(f"the agent on {path} is held by another connection (ours was not served in "
                            f"{timeout:g} s)", hint="retry once the other client (another forkd process?) is done")
        return client

    def _accepted_by(self, deadline: float) -> bool | None:
        """Whether QEMU accepted this connection, and has not closed it, by `deadline`; None if the kernel cannot
        say."""
        while self._open():
            if self.served:
                return True
            known = accepted(self.sock)
            if known is not False:
                self.served = bool(known)
                return known
            if time.monotonic() > deadline:
                return False
            time.sleep(OWN_POLL)
        return False

    @contextmanager
    def quiet(self, drain: float = QUIET_DRAIN) -> Iterator[None]:
        """Hold back every send on this connection while the block runs, once the VMM read what was sent (or
        `drain` s passed: the guest then takes no more input, and a stopped guest cannot start to). With the
        only connection held, no host byte reaches the guest's RAM meanwhile (forkd.vmm.diff_capture)."""
        with self._send_lock:
            deadline = time.monotonic() + drain
            while _unread_by_peer(self.sock) and time.monotonic() < deadline:
                time.sleep(0.0005)
            yield

    def _open(self) -> bool:
        """The peer has not closed (or shut down) the connection: a poll that does not wait and reads nothing."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLRDHUP)
        return not any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
                       for _, ev in poller.poll(0))

    @property
    def usable(self) -> bool:
        return self.violation is None and self._dead is None

    def _violate(self, what: str) -> NoReturn:
        """The guest broke the protocol: close the connection for good and say so."""
        self.violation = ProtocolViolation(
            f"the guest agent on {self.path} broke the protocol: {what}",
            hint="code running in the guest can write anything to the agent's port; forkd treats this as the child "
                 "misbehaving and stops it: fork a new child (and keep replies within forkd's caps: "
                 f"{MAX_OUTPUT} characters of output, {MAX_FILE} bytes per read_file)")
        self._shutdown()
        raise self.violation

    def send_raw(self, payload: bytes) -> None:
        """Send one frame with an arbitrary payload (tests use this to send malformed requests)."""
        with self._send_lock:
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
        except OSError as exc:
            n, self._dead = 0, ForkdError(f"guest agent connection {self.path} failed: {exc}")
        if not n:
            self._dead = self._dead or VmmLost(f"guest agent connection {self.path} closed (VMM exited?)")
            raise self._dead
        self.served = True
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
        if self._partial is None:
            n = self._frame_length(deadline)
            buf = bytearray(n)  # the whole payload, allocated once
            have = min(n, len(self._head))
            buf[:have] = self._head[:have]
            del self._head[:have]
            self._partial = [buf, have]
        buf, have = self._partial
        view = memoryview(buf)
        while have < len(buf):
            have += self._recv_into(view[have:], deadline)
            self._partial[1] = have
        self._partial = None
        try:
            return parse_reply(buf)
        except ValueError as exc:
            self._violate(f"sent a malformed reply: {exc}")

    def _check(self) -> None:
        if self.violation is not None:
            raise self.violation
        if self._dead is not None:
            raise self._dead

    def _take_turn(self, rid: int, deadline: float) -> dict | None:
        """Wait until the reply to `rid` came (returned) or the read turn is free (taken; None)."""
        with self._cond:
            while True:
                if self._pending.get(rid) is not None:
                    return self._pending[rid]
                self._check()
                if not self._reading:
                    self._reading = True
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentTimeout(f"guest agent on {self.path} did not answer in time")
                self._cond.wait(left)

    def _await(self, rid: int, deadline: float) -> dict:
        while True:
            if (reply := self._take_turn(rid, deadline)) is not None:
                return reply
            try:
                reply = self._read_frame(deadline)
            finally:
                with self._cond:
                    self._reading = False
                    self._cond.notify_all()
            with self._cond:
                if reply.get("id") == rid:
                    self._received = 0
                    return reply
                if reply.get("id") in self._pending:
                    self._pending[reply["id"]], self._received = reply, 0
                    self._cond.notify_all()

    def call_raw(self, op: str, args: dict | None = None, timeout: float = 30.0) -> dict:
        rid = self.post(op, args)
        return self._answer(rid, timeout)

    def post(self, op: str, args: dict | None = None) -> int:
        """Send a request without waiting for its answer; returns its id, for `answer`. A reply another caller's
        wait reads meanwhile is kept for it. The agent serves an op it does not run on a thread of its own
        (forkd.guest.agent.THREADED) before it reads the next request, so a request sent after it sees its effect."""
        rid = next(self._ids)
        with self._cond:
            self._check()
            self._pending[rid] = None
        try:
            self.send_raw(json.dumps({"id": rid, "op": op, "args": args or {}}).encode())
        except BaseException:
            self.forget(rid)
            raise
        return rid

    def answer(self, op: str, rid: int, timeout: float = 30.0) -> Any:
        """The result of the request `post` sent as `rid` (waiting for it up to `timeout`), checked as `call`'s."""
        return self._result(op, self._answer(rid, timeout), MAX_OUTPUT)

    def forget(self, rid: int) -> None:
        """Stop waiting for the answer to `rid`: it is dropped when it comes."""
        with self._cond:
            self._pending.pop(rid, None)

    def _answer(self, rid: int, timeout: float) -> dict:
        try:
            return self._await(rid, time.monotonic() + timeout)
        finally:
            self.forget(rid)

    def call(self, op: str, args: dict | None = None, timeout: float = 30.0, max_output: int = MAX_OUTPUT) -> Any:
        return self._result(op, self.call_raw(op, args, timeout), max_output)

    def _result(self, op: str, reply: dict, max_output: int) -> Any:
        if not reply["ok"]:
            raise AgentError(op, reply["error"])
        try:
            return check_result(op, reply["result"], max_output)
        except ValueError as exc:
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

    def run_shell(self, cmd: str, timeout: float, what: str, hint: str | None = None) -> dict:
        """`cmd` run by the guest's /bin/sh -c (a warm-up or prime step). ForkdError "{what} {cmd!r} exited N: ..."
        when it fails or outlasts `timeout`, quoting the end of its output (the guest's: cut to 400 characters and
        made printable, so no terminal escape reaches a log or a status)."""
        res = self.exec(["/bin/sh", "-c", cmd], timeout=timeout)
        if res["exit_code"] != 0 or res.get("timed_out"):
            why = f"timed out after {timeout:g} s" if res.get("timed_out") else f"exited {res['exit_code']}"
            said = "".join(c if c.isprintable() else " " for c in (res["stderr"] or res["stdout"]).strip()[-400:])
            raise ForkdError(f"{what} {cmd!r} {why}: {said}", hint=hint)
        return res

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
            self._violate(f"read_file returned {len(res['data'])} base64 characters for at most {MAX_FILE} bytes")
        try:
            data = base64.b64decode(res["data"], validate=True)
        except (binascii.Error, ValueError) as exc:
            self._violate(f"read_file returned data that is not base64 ({exc})")
        if res["truncated"]:
            raise InvalidInput(f"guest file {path} is larger than {MAX_FILE} bytes, the most read_file returns",
                               hint="copy it out in parts (e.g. exec 'split -b 8M FILE FILE.part-' and read each "
                                    "part), or compress it in the guest first")
        return data

    # processes -----------------------------------------------------------------------------
    def start(self, argv: list[str] | None = None, *, cmd: str | None = None, env: dict | None = None,
              cwd: str | None = None, user: str | None = None, stdin: bool = False,
              pty: dict | None = None, tag: str | None = None) -> int:
        """Start a process in the guest (argv, or `cmd` run by /bin/sh -c) and return its pid at once. Its
        stdin is a pipe (`stdin=True`), a PTY (`pty={"rows", "cols"}`; stdout carries its output) or
        /dev/null. It runs until it ends or is killed, whoever is connected."""
        args: dict[str, Any] = {"argv": argv, "cmd": cmd, "env": env, "cwd": cwd, "user": user,
                                "stdin": stdin, "pty": pty, "tag": tag}
        return self.call("proc_start", {k: v for k, v in args.items() if v is not None}, timeout=120.0)["pid"]

    def read_output(self, pid: int, after: int = 0, wait: float = 30.0) -> Output:
        """Output of `pid` written after chunk `after` (which the agent may then forget), waiting up to `wait`
        seconds for some; `Output.done` once the process ended and everything was read."""
        res = self.call("proc_read", {"pid": pid, "after": after, "wait": wait, "max_bytes": MAX_READ},
                        timeout=wait + 120.0)  # a loaded TCG guest may take long to answer: not an error
        try:
            return check_output(res, after, MAX_READ)
        except ValueError as exc:
            self._violate(f"sent a misshapen proc_read reply: {exc}")

    def stream(self, pid: int, wait: float = 30.0) -> Iterator[tuple[str, bytes]]:
        """(stream, bytes) as `pid` writes them; returns its exit code (StopIteration.value) when it ends."""
        after = 0
        while True:
            out = self.read_output(pid, after, wait)
            after = out.seq
            yield from out.chunks
            if out.done:
                return out.exit_code

    def send_stdin(self, pid: int, data: bytes, eof: bool = False) -> int:
        """Write to the process's stdin (or its PTY), in frames of at most 1 MiB; `eof` closes it (^D on a PTY)."""
        view = memoryview(data)
        while True:
            part, view = view[:1 << 20], view[1 << 20:]
            self.call("proc_write", {"pid": pid, "data": base64.b64encode(part).decode(), "eof": eof and not view},
                      timeout=300.0)
            if not view:
                return len(data)

    def resize(self, pid: int, rows: int, cols: int) -> None:
        self.call("proc_resize", {"pid": pid, "rows": rows, "cols": cols})

    def signal(self, pid: int, sig: int | str = "SIGTERM") -> bool:
        """Signal the process's group; False if it had already ended."""
        return self.call("proc_signal", {"pid": pid, "signal": sig})["sent"]

    def kill_process(self, pid: int) -> bool:
        return self.call("proc_kill", {"pid": pid})["sent"]

    def wait(self, pid: int, timeout: float = 60.0) -> dict:
        """The process's entry once it has exited, or after `timeout` seconds (at most 60; `running` says)."""
        try:
            res = self.call("proc_wait", {"pid": pid, "timeout": timeout}, timeout=timeout + 30.0)
            return check_row(res["process"])
        except ValueError as exc:
            self._violate(f"sent a misshapen proc_wait reply: {exc}")

    def processes(self) -> list[dict]:
        """The processes started by proc_start that the agent still holds (running, or not yet collected)."""
        try:
            return [check_row(p) for p in self.call("proc_list")["processes"]]
        except ValueError as exc:
            self._violate(f"sent a misshapen proc_list reply: {exc}")

    def close(self) -> None:
        """Release this handle; the connection closes when its last user releases it."""
        with _POOL_LOCK:
            self._refs -= 1
            if self._refs > 0:
                return
            if _POOL.get(str(self.path)) is self:
                del _POOL[str(self.path)]
        self._shutdown()

    def _shutdown(self) -> None:
        """Close the connection now, whoever else uses it (they get the violation, or 'closed')."""
        with _POOL_LOCK:
            if _POOL.get(str(self.path)) is self:
                del _POOL[str(self.path)]
        self._dead = self._dead or ForkdError(f"guest agent connection {self.path} was closed")
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            self.sock.close()
        with self._cond:
            self._cond.notify_all()
