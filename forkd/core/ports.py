"""Ports of a sandbox reached through the daemon: who may (grants) and how (a connection to the one child's port).

A grant is (sandbox, guest TCP port) -> a random token (32 bytes, URL-safe). A child's grants are kept beside its
record, in its directory (GRANTS, mode 0600, replaced atomically under a lock: forkd.base.atomic), with the
child's creation time: so they outlive a daemon restart, a revoked one stays revoked, and they go with the child
(its directory is removed with its record; a later child under the same id is not the one granted; a child found
not running has its grants dropped). A request presents the token; `PortGrants.check` compares it in constant
time (hmac.compare_digest) with the grant of exactly that sandbox and port, so a token opens one port of one
sandbox and nothing else.

The daemon connects to a port of a child with a network device only through the child's own network namespace,
to the guest's fixed address (forkd.sandbox.netns.GUEST_ADDR): never an address a client names. A child without
one is reached through its guest agent, on the guest's loopback (forkd.core.relay).
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.base.atomic import write_json
from forkd.base.errors import Conflict, NotFound, Unavailable
from forkd.base.locks import file_lock

MAX_GRANTS_PER_SANDBOX = 64
GRANTS = "ports.json"  # in the child's directory
GRANTS_LOCK = "ports.lock"
MAX_GRANTS_FILE = 64 << 10  # bytes: far above MAX_GRANTS_PER_SANDBOX grants; a larger file is not ours


@dataclass(frozen=True)
class Grant:
    sandbox_id: str
    port: int
    token: str


class PortGrants:
    """The node's grants, read from and written to each child's directory (thread- and process-safe: each
    change holds the child's grants lock, a flock on its own descriptor)."""

    def grant(self, rec: Any, port: int) -> Grant:
        """A grant for `port` of the child `rec`: the existing one, or a new token (written before it is given)."""
        with self._held(rec):
            have = _read(rec)
            if str(port) not in have and len(have) >= MAX_GRANTS_PER_SANDBOX:
                raise Conflict(f"sandbox {rec.id} already has {MAX_GRANTS_PER_SANDBOX} ports opened",
                               hint="revoke one first: DELETE /v1/sandboxes/{id}/ports/{port}")
            if str(port) not in have:
                have[str(port)] = secrets.token_urlsafe(32)
                _write(rec, have)
            return Grant(rec.id, port, have[str(port)])

    def list(self, rec: Any) -> list[Grant]:
        return [Grant(rec.id, int(p), t) for p, t in sorted(_read(rec).items(), key=lambda kv: int(kv[0]))]

    def revoke(self, rec: Any, port: int) -> bool:
        with self._held(rec):
            have = _read(rec)
            if have.pop(str(port), None) is None:
                return False
            _write(rec, have)
            return True

    def drop(self, rec: Any) -> None:
        """Every grant of a child that is gone (or going)."""
        with self._held(rec):
            (Path(rec.dir) / GRANTS).unlink(missing_ok=True)

    def check(self, rec: Any, port: int, token: str) -> bool:
        """Does `token` open `port` of the child `rec`? Constant-time in the token."""
        want = _read(rec).get(str(port))
        expected = want if want is not None else secrets.token_urlsafe(32)
        return hmac.compare_digest(token.encode(), expected.encode()) and want is not None

    def _held(self, rec: Any) -> Any:
        """The child's grants lock (its directory gone: NotFound)."""
        try:
            return file_lock(Path(rec.dir) / GRANTS_LOCK)
        except FileNotFoundError:
            raise NotFound(f"sandbox {rec.id} is gone", hint="its ports went with it") from None


def _read(rec: Any) -> dict[str, str]:
    """The child's grants, port (as text) -> token; none when there is no file or it was made for another child
    under the same id."""
    try:
        with open(Path(rec.dir) / GRANTS, "rb") as f:
            data = f.read(MAX_GRANTS_FILE + 1)
        raw = json.loads(data) if len(data) <= MAX_GRANTS_FILE else None
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("born") != rec.created_at or not isinstance(raw.get("ports"), dict):
        return {}
    return {p: t for p, t in raw["ports"].items() if p.isdigit() and isinstance(t, str)}


def _write(rec: Any, grants: dict[str, str]) -> None:
    try:
        write_json(Path(rec.dir) / GRANTS, {"born": rec.created_at, "ports": grants}, mode=0o600, durable=False)
    except FileNotFoundError:
        raise NotFound(f"sandbox {rec.id} is gone", hint="its ports went with it") from None


@dataclass(frozen=True)
class Target:
    """Where a child's ports are reached: through its network namespace `netns`, else (None) through its agent."""

    child_id: str
    netns: str | None


def reachable(rec: Any) -> Target:
    """How the running child `rec`'s ports are reached: its namespace when it has a network device, its guest
    agent when not (a child without a NIC may still have an empty namespace). NotFound when it is not running."""
    if rec.status != "running":
        raise NotFound(f"sandbox {rec.id} is {rec.status}, not running", hint="its ports went with it")
    if rec.network == "isolated" and rec.netns:
        return Target(rec.id, rec.netns)
    return Target(rec.id, None)


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
