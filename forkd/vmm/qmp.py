"""The one QMP client: line-delimited JSON over a unix socket, with descriptor passing for `getfd`."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forkd.base.errors import ForkdError
from forkd.vmm.driver import VmmLost


class QMPError(ForkdError):
    def __init__(self, command: str, error: dict):
        super().__init__(f"QMP {command} failed: {error.get('class')}: {error.get('desc')}")
        self.error = error


class QMPDisconnected(VmmLost):
    """The QMP socket broke (the VMM died or closed it): a typed error, never a bare OSError."""


class QMPClient:
    def __init__(self, path: Path, timeout: float = 10.0, alive: Callable[[], bool] | None = None):
        self.path = Path(path)
        self.events: list[dict] = []
        self.broken = False  # an answer timed out: the connection is closed
        self._buf = b""
        self.sock = _connect_unix(self.path, timeout, alive)
        self.sock.settimeout(timeout)
        self.send("qmp_capabilities")  # with the greeting still unread: one round trip for both
        greeting = self._read()
        if "QMP" not in greeting:
            raise ForkdError(f"unexpected QMP greeting on {self.path}: {greeting}")
        self.result("qmp_capabilities")

    def _read(self) -> dict:
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise QMPDisconnected(f"QMP connection {self.path} closed by QEMU")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, command: str, arguments: dict | None = None, fds: list[int] | None = None,
                timeout: float | None = None) -> Any:
        self.send(command, arguments, fds, timeout)
        return self.result(command)

    def send(self, command: str, arguments: dict | None = None, fds: list[int] | None = None,
             timeout: float | None = None) -> None:
        """Send a command without waiting for its answer: QEMU runs commands in the order they came, so several
        can be in flight; each caller of `send` reads its answer with `result`, in the same order."""
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        data = json.dumps(msg).encode() + b"\n"
        try:
            if timeout is not None:
                self.sock.settimeout(timeout)
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise QMPDisconnected(f"QMP {command}: connection {self.path} lost ({exc}): the VMM has exited") from exc

    def batch(self, commands: list[tuple[str, dict | None, list[int] | None]]) -> list[Any]:
        """Send every (command, arguments, fds) at once and read their answers in order: one round trip for all.
        A command QEMU refused gives its QMPError in its place (the later answers are still read)."""
        for command, arguments, fds in commands:
            self.send(command, arguments, fds)
        out: list[Any] = []
        for command, _, _ in commands:
            try:
                out.append(self.result(command))
            except QMPError as exc:
                out.append(exc)
        return out

    def result(self, command: str) -> Any:
        """The answer to the oldest command sent and not yet answered (events seen meanwhile go to `events`). A
        timeout drops the connection (`broken`): a late answer would be taken for the next command's."""
        while True:
            try:
                reply = self._read()
            except TimeoutError as exc:
                self.broken = True
                self.close()
                raise QMPDisconnected(f"QMP {command}: no answer on {self.path} in time; connection dropped") \
                    from exc
            except ConnectionResetError as exc:
                raise QMPDisconnected(f"QMP {command}: connection {self.path} lost ({exc}): the VMM has exited") \
                    from exc
            if "event" in reply:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise QMPError(command, reply["error"])
            return reply.get("return")

    def next_event(self, timeout: float) -> dict | None:
        """Block up to `timeout` s for the next event QEMU sends (kept in `events` too); None if none came.
        For waiting on an event without polling QEMU with commands (each one takes QEMU's main-loop lock)."""
        old = self.sock.gettimeout()
        self.sock.settimeout(max(timeout, 0.0001))
        try:
            msg = self._read()  # a timeout keeps any partial line in the buffer
        except TimeoutError:
            return None
        finally:
            self.sock.settimeout(old)
        if "event" not in msg:
            raise ForkdError(f"unexpected QMP message with no command outstanding on {self.path}: {msg}")
        self.events.append(msg)
        return msg

    def wait_migration(self, timeout: float = 120.0, poll: float = 0.002) -> dict:
        """Poll query-migrate until completed; raise on failure or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.execute("query-migrate") or {}
            status = info.get("status")
            if status == "completed":
                return info
            if status in ("failed", "cancelled"):
                raise ForkdError(f"migration {status}: {info.get('error-desc', 'no reason given')}")
            if time.monotonic() > deadline:
                raise ForkdError(f"migration did not complete within {timeout:.0f}s (status {status})")
            time.sleep(poll)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _connect_unix(path: Path, timeout: float, alive: Callable[[], bool] | None = None) -> socket.socket:
    """Connect to a unix socket that the VMM may not have created yet. A connect that would block (QEMU serves one
    connection per chardev: another process holding it fills the backlog) is bounded by `timeout` too; `alive`
    (the VMM is still running) ends the wait at once when it says no: a VMM that exited opens no socket."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            s.connect(str(path))
            s.settimeout(None)
            return s
        except (FileNotFoundError, ConnectionRefusedError, TimeoutError, BlockingIOError) as exc:
            s.close()
            if alive is not None and not alive():
                raise ForkdError(f"the VMM exited before it opened {path}") from exc
            if time.monotonic() > deadline:
                why = "another process may hold its only connection" if isinstance(exc, TimeoutError) else exc
                raise ForkdError(f"cannot connect to {path} within {timeout:.1f}s: {why}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.02)


connect_unix = _connect_unix
