"""A TCP connection to a port in a child made through its guest agent, for children without a network device.

`Relay.open` asks the agent to connect to the port on the guest's loopback (forkd.vmm.agent_tcp) and returns the
daemon's end of a local socket pair; two threads copy bytes between the other end and the agent's stream (long
polls for what the guest's server sends, one write per chunk the client sends). The caller sees a plain socket,
so the HTTP, WebSocket and raw TCP relays above it are the same as through a child's network namespace.

Bounds: at most MAX_STREAMS streams per child and MAX_TOTAL in all (Conflict past either); a stream that moved no
byte either way for `idle` seconds is closed; each agent call carries at most one chunk (forkd.vmm.agent_tcp.CHUNK)
and its reply is checked before it is believed. A guest that breaks the protocol is stopped by the runtime
(forkd.sandbox.child), which ends its streams with it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import Counter
from typing import Any

from forkd.base.errors import Conflict, ForkdError, Unavailable
from forkd.vmm import agent_tcp
from forkd.vmm.agent_client import AgentClient
from forkd.vmm.agent_replies import AgentError

MAX_STREAMS = 32
MAX_TOTAL = 256
IDLE = 300.0  # s without a byte either way before a stream is closed
POLL = 20.0  # s one long poll for the guest's bytes lasts at most

log = logging.getLogger("forkd.relay")


class Relay:
    """The node's relayed streams (thread-safe). `rt`: the Runtime whose `agent(child_id)` reaches a child."""

    def __init__(self, rt: Any, idle: float = IDLE, max_streams: int = MAX_STREAMS, max_total: int = MAX_TOTAL):
        self.rt, self.idle, self.max_streams, self.max_total = rt, idle, max_streams, max_total
        self._lock = threading.Condition()
        self._open: Counter[str] = Counter()

    def streams(self, child_id: str) -> int:
        with self._lock:
            return self._open[child_id]

    def settle(self, child_id: str, at_most: int = 0, timeout: float = 60.0) -> bool:
        """Wait until at most `at_most` of the child's streams are open (a stream ends on its own threads after
        its socket closed); whether that happened within `timeout`."""
        with self._lock:
            return self._lock.wait_for(lambda: self._open[child_id] <= at_most, timeout)

    def _take(self, child_id: str) -> None:
        with self._lock:
            if self._open[child_id] >= self.max_streams or sum(self._open.values()) >= self.max_total:
                raise Conflict(f"sandbox {child_id} has {self._open[child_id]} relayed connections open "
                               f"(at most {self.max_streams} per sandbox, {self.max_total} in all)",
                               hint="close some connections first; idle ones close by themselves")
            self._open[child_id] += 1

    def _give(self, child_id: str) -> None:
        with self._lock:
            self._open[child_id] -= 1
            if self._open[child_id] <= 0:
                del self._open[child_id]
            self._lock.notify_all()

    def open(self, child_id: str, port: int) -> socket.socket:
        """A socket whose peer is `port` on the child's loopback; Unavailable when nothing answers there."""
        self._take(child_id)
        try:
            rec = self.rt.child(child_id)
            keep = AgentClient.shared(rec.agent_socket)  # the one connection, held between the stream's calls
            try:
                with self.rt.agent(child_id) as a:
                    sid = agent_tcp.tcp_open(a, port)
            except BaseException:
                keep.close()
                raise
        except AgentError as exc:
            self._give(child_id)
            raise Unavailable(f"nothing answers on port {port} in sandbox {child_id} ({exc.error.get('message')})",
                              hint="start a server there (on 127.0.0.1 or 0.0.0.0)") from None
        except BaseException:
            self._give(child_id)
            raise
        mine, theirs = socket.socketpair()
        _Stream(self, child_id, sid, mine, keep).start()
        return theirs


class _Stream:
    """One relayed connection: its two pumps, its idle clock, and its end (once, whichever side ends it)."""

    def __init__(self, relay: Relay, child_id: str, sid: str, sock: socket.socket, keep: AgentClient):
        self.relay, self.child_id, self.sid, self.sock, self.keep = relay, child_id, sid, sock, keep
        self.touched = time.monotonic()
        self._ended = threading.Event()
        self._ending = threading.Lock()
        self._left = 2  # pumps still running

    def start(self) -> None:
        for pump in (self._down, self._up):
            threading.Thread(target=self._run, args=(pump,), name=f"relay-{self.child_id}", daemon=True).start()

    def _idle(self) -> bool:
        return time.monotonic() - self.touched > self.relay.idle

    def _call(self, fn, *args):
        with self.relay.rt.agent(self.child_id) as a:
            return fn(a, self.sid, *args)

    def _run(self, pump) -> None:
        try:
            pump()
        except (ForkdError, OSError) as exc:
            if not self._ended.is_set():
                log.info("relay to %s stream %s ended: %s", self.child_id, self.sid, exc)
            self._end()
        finally:
            with self.relay._lock:
                self._left -= 1
                last = self._left == 0
            if last:
                self._end()

    def _down(self) -> None:
        """The guest's server -> the client, until it closes its side (or the stream ends)."""
        while not self._ended.is_set():
            data, eof = self._call(agent_tcp.tcp_read, min(POLL, self.relay.idle))
            if data:
                self.touched = time.monotonic()
                self.sock.sendall(data)
            if eof:
                self.sock.shutdown(socket.SHUT_WR)
                return
            if not data and self._idle():
                log.info("relay to %s stream %s idle for %g s: closed", self.child_id, self.sid, self.relay.idle)
                self._end()
                return

    def _up(self) -> None:
        """The client -> the guest's server, until the client closes its side (or the stream ends)."""
        self.sock.settimeout(self.relay.idle)
        while not self._ended.is_set():
            try:
                data = self.sock.recv(agent_tcp.CHUNK)
            except TimeoutError:
                if self._idle():
                    self._end()
                    return
                continue
            if self._ended.is_set():
                return
            self.touched = time.monotonic()
            self._call(agent_tcp.tcp_write, data, not data)
            if not data:
                return

    def _end(self) -> None:
        """Close both ends once: the agent's stream (best effort: the guest may be gone) and the local socket."""
        with self._ending:
            if self._ended.is_set():
                return
            self._ended.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(ForkdError, OSError):
            self._call(agent_tcp.tcp_close)
        self.sock.close()
        self.keep.close()
        self.relay._give(self.child_id)
