"""What a scoped token (forkd.base.scoped_tokens: a claim's children, minted by the Kubernetes operator) may call.

Only the routes that use one of its children as it is: `GET /v1/sandboxes/{id}` and, under it, exec, eval, ping,
files, processes, logs and ports; plus `/healthz` and `/version`. Not listing sandboxes, not fork or branch (they
make children or snapshots outside the scope), not delete or timeout (a claim's lifetime is its ForkClaim's), and
nothing of the rest of the API. The path is matched before routing, on the raw path the router also sees.
"""

from __future__ import annotations

import re

from forkd.base.scoped_tokens import PREFIX, children_of

SANDBOX = re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)(?:/(?P<sub>[^/]+)(?:/.*)?)?$")
SUBPATHS = frozenset({"exec", "eval", "ping", "files", "processes", "logs", "ports"})
OPEN = frozenset({("GET", "/healthz"), ("GET", "/version")})
SCOPE_KEY = "forkd.scoped_children"  # set in the ASGI scope for a request a scoped token let through


def is_scoped(header: str | None) -> bool:
    return bool(header) and header[:7].lower() == "bearer " and header[7:].strip().startswith(PREFIX)


def scoped_children(header: str | None, bearer: str | None, now: float) -> frozenset[str] | None:
    """The children the request's scoped token opens (None: no valid scoped token, or no bearer to check it by)."""
    if not bearer or not is_scoped(header):
        return None
    return children_of(header[7:].strip(), bearer, now)


def allows(method: str, path: str, children: frozenset[str]) -> bool:
    """May a token scoped to `children` make this call?"""
    if (method, path) in OPEN:
        return True
    m = SANDBOX.match(path)
    if m is None or m["id"] not in children:
        return False
    if m["sub"] is None:
        return method == "GET"
    return m["sub"] in SUBPATHS
