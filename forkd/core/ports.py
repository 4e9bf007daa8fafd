"""Ports of a sandbox reached through the daemon: who may (grants) and how (a connection to the one child's port).

A grant is (sandbox id, guest TCP port) -> a random token (32 bytes, URL-safe) and the child's creation time, held
in the daemon's memory only: revoked by DELETE, dropped when the child is found gone, and all gone when the daemon
stops. A request presents the token; `PortGrants.check` compares it in constant time (hmac.compare_digest) with the
grant of exactly that sandbox and port, made for that very child (a later child under the same id is not it), so a
token opens one port of one sandbox and nothing else.

The daemon connects to a port only through the child's own network namespace, to the guest's fixed address
(forkd.sandbox.netns.GUEST_ADDR): never an address a client names. A child without a NIC (its parent built with
network none) has no port to reach: refused with a hint.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import threading
from dataclasses import dataclass

from forkd.base.errors import Conflict, NotFound, Unavailable

MAX_GRANTS_PER_SANDBOX = 64


@dataclass(frozen=True)
class Grant:
    sandbox_id: str
    port: int
    token: str
    born: float = 0.0  # the child's created_at: the grant is for that child only


class PortGrants:
    """The daemon's grants (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: dict[tuple[str, int], Grant] = {}

    def grant(self, sandbox_id: str, port: int, born: float) -> Grant:
        """A grant for `port` of the child `sandbox_id` created at `born`: the existing one, or a new token."""
        with self._lock:
            have = self._grants.get((sandbox_id, port))
            if have is not None and have.born == born:
                return have
            if have is None and sum(1 for sid, _ in self._grants if sid == sandbox_id) >= MAX_GRANTS_PER_SANDBOX:
                raise Conflict(f"sandbox {sandbox_id} already has {MAX_GRANTS_PER_SANDBOX} ports opened",
                               hint="revoke one first: DELETE /v1/sandboxes/{id}/ports/{port}")
            made = self._grants[(sandbox_id, port)] = Grant(sandbox_id, port, secrets.token_urlsafe(32), born)
            return made

    def list(self, sandbox_id: str) -> list[Grant]:
        with self._lock:
            return [g for (s, _), g in sorted(self._grants.items()) if s == sandbox_id]

    def revoke(self, sandbox_id: str, port: int) -> bool:
        with self._lock:
            return self._grants.pop((sandbox_id, port), None) is not None

    def drop(self, sandbox_id: str) -> None:
        """Every grant of a sandbox (it is gone)."""
        with self._lock:
            for key in [k for k in self._grants if k[0] == sandbox_id]:
                del self._grants[key]

    def check(self, sandbox_id: str, port: int, token: str, born: float) -> bool:
        """Does `token` open `port` of the child `sandbox_id` created at `born`? Constant-time in the token."""
        with self._lock:
            want = self._grants.get((sandbox_id, port))
        expected = want.token if want is not None else secrets.token_urlsafe(32)
        return hmac.compare_digest(token.encode(), expected.encode()) and want is not None and want.born == born


def reachable(rec) -> str:
    """The network namespace through which the child's ports are reached; NotFound/Conflict when it has none."""
    if rec.status != "running":
        raise NotFound(f"sandbox {rec.id} is {rec.status}, not running", hint="its ports went with it")
    if rec.network != "isolated" or not rec.netns:  # a child without a NIC may still have an empty namespace
        raise Conflict(f"sandbox {rec.id} has no network device, so no port to reach",
                       hint="fork it from a snapshot built with --network isolated (ForkParent spec.network: "
                            "isolated); its egress may stay none")
    return rec.netns


def connect(netns_name: str, port: int, timeout: float = 10.0) -> socket.socket:
    """A TCP connection to the guest's `port`, made inside the child's namespace `netns_name` (this thread only,
    then back). Unavailable when nothing answers there."""
    from forkd.sandbox import netns

    try:
        with netns.inside(netns_name):
            sock = socket.create_connection((netns.GUEST_ADDR, port), timeout=timeout)
    except OSError as exc:
        raise Unavailable(f"nothing answers on port {port} in the sandbox ({exc.strerror or exc})",
                          hint="start a server there listening on 0.0.0.0 (or the guest's eth0)") from None
    sock.settimeout(None)
    return sock
