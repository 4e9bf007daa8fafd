"""Ports of a sandbox reached through the daemon: who may (grants) and how (a connection to the one child's port).

A grant opens one guest TCP port of one sandbox to whoever holds its token (32 random bytes, URL-safe). The token
is shown once, when the grant is made; the daemon keeps only its SHA-256 (bound to the sandbox id and port), so
its files, listings and logs never hold a working token. A token is 256 random bits: its hash can be neither
reversed nor guessed, so no key is needed (a per-home key would be one more secret to keep and rotate).

A child's grants are kept beside its record, in its directory (GRANTS, mode 0600, replaced atomically under a
lock: forkd.base.atomic), with the child's creation time: so they outlive a daemon restart, a revoked one stays
revoked, and they go with the child (its directory is removed with its record; a later child under the same id is
not the one granted; a child found not running has its grants dropped). Each grant has an id (`g` + hex: never
all digits, so a path segment names a grant or a port unambiguously) by which it is listed and revoked; a port
may have several grants (each open gives a new token). A request presents the token; `PortGrants.check` hashes it
and compares it in constant time (hmac.compare_digest) with each grant of exactly that sandbox and port, so a token
opens one port of one sandbox and nothing else.

The daemon connects to a port of a child with a network device only through the child's own network namespace,
to the guest's fixed address (forkd.sandbox.netns.GUEST_ADDR): never an address a client names. A child without
one is reached through its guest agent, on the guest's loopback (forkd.core.relay).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import time
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
MAX_TOKEN = 128  # characters: a token is 43; a longer one opens nothing and is not hashed
LEGACY = "legacy"  # marks (in memory only) a grant read from an older daemon's file, which kept tokens in clear


@dataclass(frozen=True)
class Grant:
    """One grant: `token` is set only on the Grant `PortGrants.grant` returns (it is never kept)."""

    id: str
    sandbox_id: str
    port: int
    created_at: float
    token: str | None = None


def digest(sandbox_id: str, port: int, token: str) -> str:
    """What the grants file keeps of a token: its SHA-256, bound to the sandbox id and port."""
    return hashlib.sha256(f"forkd-port-grant\0{sandbox_id}\0{port}\0{token}".encode()).hexdigest()


class PortGrants:
    """The node's grants, read from and written to each child's directory (thread- and process-safe: each
    change holds the child's grants lock, a flock on its own descriptor)."""

    def grant(self, rec: Any, port: int) -> Grant:
        """A new grant for `port` of the child `rec`, with its token (written, as a hash, before it is given)."""
        with self._held(rec):
            have = _read(rec)
            if len(have) >= MAX_GRANTS_PER_SANDBOX:
                raise Conflict(f"sandbox {rec.id} already has {MAX_GRANTS_PER_SANDBOX} port grants",
                               hint="revoke some first: DELETE /v1/sandboxes/{id}/ports/{grant id or port}")
            gid, token = "g" + secrets.token_hex(8), secrets.token_urlsafe(32)
            have[gid] = {"port": port, "sha256": digest(rec.id, port, token), "at": time.time()}
            _write(rec, have)
            return Grant(gid, rec.id, port, have[gid]["at"], token)

    def list(self, rec: Any) -> list[Grant]:
        """The child's grants, by port then age, without tokens."""
        out = [Grant(gid, rec.id, g["port"], g["at"]) for gid, g in self._current(rec).items()]
        return sorted(out, key=lambda g: (g.port, g.created_at, g.id))

    def revoke(self, rec: Any, which: str | int) -> list[Grant]:
        """Revoke the grant with id `which`, or every grant of the port `which` (a number); the ones revoked."""
        port = int(which) if isinstance(which, int) or (which.isascii() and which.isdigit()) else None
        with self._held(rec):
            have = _read(rec)
            gone = [gid for gid, g in have.items() if gid == which or g["port"] == port]
            if gone:
                _write(rec, {gid: g for gid, g in have.items() if gid not in gone})
            return [Grant(gid, rec.id, have[gid]["port"], have[gid]["at"]) for gid in gone]

    def drop(self, rec: Any) -> None:
        """Every grant of a child that is gone (or going)."""
        with self._held(rec):
            (Path(rec.dir) / GRANTS).unlink(missing_ok=True)

    def check(self, rec: Any, port: int, token: str) -> bool:
        """Does `token` open `port` of the child `rec`? Constant-time in the token: its hash is compared with
        every grant of that port (with a dummy when there is none)."""
        if len(token) > MAX_TOKEN:
            return False
        got = digest(rec.id, port, token).encode()
        want = [g["sha256"].encode() for g in self._current(rec).values() if g["port"] == port]
        ok = False
        for w in want or [b"0" * 64]:
            ok |= hmac.compare_digest(got, w)
        return ok and bool(want)

    def _current(self, rec: Any) -> dict[str, dict]:
        """The child's grants; an older daemon's file (tokens in clear) is replaced by their hashes first."""
        have = _read(rec)
        if any(LEGACY in g for g in have.values()):
            try:
                with self._held(rec):
                    have = _read(rec)
                    _write(rec, have)
            except NotFound:
                return {}
        return have

    def _held(self, rec: Any) -> Any:
        """The child's grants lock (its directory gone: NotFound)."""
        try:
            return file_lock(Path(rec.dir) / GRANTS_LOCK)
        except FileNotFoundError:
            raise NotFound(f"sandbox {rec.id} is gone", hint="its ports went with it") from None


def _read(rec: Any) -> dict[str, dict]:
    """The child's grants, id -> {port, sha256, at}; none when there is no file or it was made for another child
    under the same id. An entry of another shape is skipped: it opens nothing. A file an older daemon wrote
    (`ports`: port -> token in clear) is read as the hashes of its tokens (`PortGrants._current` replaces it)."""
    try:
        with open(Path(rec.dir) / GRANTS, "rb") as f:
            data = f.read(MAX_GRANTS_FILE + 1)
        raw = json.loads(data) if len(data) <= MAX_GRANTS_FILE else None
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("born") != rec.created_at:
        return {}
    if isinstance(raw.get("ports"), dict):
        return _legacy(rec, raw["ports"])
    if not isinstance(raw.get("grants"), dict):
        return {}
    return {gid: g for gid, g in raw["grants"].items() if _is_grant(gid, g)}


def _legacy(rec: Any, ports: dict) -> dict[str, dict]:
    """An older daemon's grants (port -> token in clear) as hashed ones; their ids derive from the hash."""
    out = {}
    for p, token in ports.items():
        if isinstance(p, str) and p.isdigit() and 1 <= int(p) <= 65535 and isinstance(token, str):
            h = digest(rec.id, int(p), token)
            out["g" + h[:16]] = {"port": int(p), "sha256": h, "at": rec.created_at, LEGACY: True}
    return out


def is_grant_id(gid: Any) -> bool:
    """`g` and 16 lowercase hex digits."""
    return isinstance(gid, str) and len(gid) == 17 and gid[0] == "g" and all(c in "0123456789abcdef" for c in gid[1:])


def _is_grant(gid: Any, g: Any) -> bool:
    return (is_grant_id(gid) and isinstance(g, dict)
            and set(g) == {"port", "sha256", "at"} and type(g["port"]) is int and 1 <= g["port"] <= 65535
            and isinstance(g["sha256"], str) and len(g["sha256"]) == 64 and isinstance(g["at"], int | float))


def _write(rec: Any, grants: dict[str, dict]) -> None:
    kept = {gid: {k: v for k, v in g.items() if k != LEGACY} for gid, g in grants.items()}
    try:
        write_json(Path(rec.dir) / GRANTS, {"born": rec.created_at, "grants": kept}, mode=0o600, durable=False)
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
