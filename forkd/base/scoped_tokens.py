"""Tokens that open a daemon's API for a few children only (a claim's), minted by whoever holds its bearer token.

A scoped token is `fks1.<payload>.<mac>`: the payload (base64url JSON) lists the child ids, an expiry (Unix seconds,
0 for none) and a nonce; the mac is HMAC-SHA256 over `fks1.<payload>` with a key derived from the daemon's bearer
token. The daemon keeps no table of them: it recomputes the mac (constant-time compare), so they survive its
restarts, and a new bearer token revokes them all. Minting the same children, expiry and nonce gives the same
token (the operator rewrites its Secret only when the children change). What such a token may call is the API's
business (forkd.api.scoped).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re

PREFIX = "fks1."
MAX_TOKEN = 8192  # characters: a header bigger than this is not looked at
MAX_CHILDREN = 256
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _key(bearer: str) -> bytes:
    return hmac.new(bearer.encode(), b"forkd scoped token v1", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint(bearer: str, children: list[str] | tuple[str, ...], expires: int = 0, nonce: str = "") -> str:
    """A token for exactly `children` (ids), valid until `expires` (Unix seconds; 0: as long as the bearer token)."""
    ids = sorted(set(children))
    if not ids or len(ids) > MAX_CHILDREN or not all(_ID.match(i) for i in ids):
        raise ValueError(f"a scoped token names 1-{MAX_CHILDREN} child ids (letters, digits, '_', '.', '-'): {ids!r}")
    payload = _b64(json.dumps({"c": ids, "e": int(expires), "n": str(nonce)[:64]}, separators=(",", ":")).encode())
    mac = hmac.new(_key(bearer), (PREFIX + payload).encode(), hashlib.sha256).digest()
    return f"{PREFIX}{payload}.{_b64(mac)}"


def children_of(token: str, bearer: str, now: float) -> frozenset[str] | None:
    """The child ids `token` opens, or None: not a scoped token, a wrong mac, a malformed payload, or expired."""
    if not token.startswith(PREFIX) or len(token) > MAX_TOKEN or token.count(".") != 2:
        return None
    payload, _, mac = token[len(PREFIX):].partition(".")
    want = hmac.new(_key(bearer), (PREFIX + payload).encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), want):
            return None
        doc = json.loads(_unb64(payload))
    except (ValueError, TypeError):
        return None
    ids, expires = doc.get("c") if isinstance(doc, dict) else None, doc.get("e") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not ids or len(ids) > MAX_CHILDREN or not isinstance(expires, int):
        return None
    if not all(isinstance(i, str) and _ID.match(i) for i in ids) or (expires and now >= expires):
        return None
    return frozenset(ids)
