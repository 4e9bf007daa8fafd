"""A ForkClaim's children, reachable from a pod: a Secret in the claim's namespace holding a token scoped to exactly
those children (forkd.base.scoped_tokens, minted from the node daemons' bearer token FORKD_TOKEN, which every node
of the DaemonSet shares) and where to use it.

The Secret `forkd-claim-<name>` has the keys `token`, `children` (JSON: id, node, endpoint of each) and, when all
the children are on one node, `endpoint` (that daemon's URL). A pod mounts it and calls the SDK:
`Sandbox.connect(child_id, url=endpoint, token=token)`; the daemon lets the token reach those children's exec,
eval, files, processes, logs and ports, and nothing else (forkd.api.scoped). The token expires with the claim
(status.expiresAt), names the claim's uid as its nonce, and is the same for the same children, so the Secret is
rewritten only when they change. The Secret is owned by the ForkClaim (garbage-collected with it) and deleted by
the claim's finalizer too. No Secret while a child's node is reached over a unix socket (no endpoint a pod can
use) or the operator has no FORKD_TOKEN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from forkd.base.scoped_tokens import mint
from forkd.base.settings import settings
from forkd.operator.combine import LOST
from forkd.operator.crdgen import GROUP, VERSION

LABEL = "forkd.dev/claim"
CLIENT_POD_LABEL = "forkd.dev/sandbox-client"  # on a pod that uses a claim's Secret
CLIENT_NAMESPACE_LABEL = "forkd.dev/sandbox-clients"  # on that pod's namespace


def secret_name(claim: str) -> str:
    return f"forkd-claim-{claim}"


def _epoch(rfc3339: str | None) -> int:
    if not rfc3339:
        return 0
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp())


def secret_data(children: list[Mapping[str, Any]], bearer: str, expires_at: str | None, nonce: str) -> dict | None:
    """The Secret's data for these children (lost ones left out), or None when a pod could not use it."""
    live = [c for c in children if c.get("status") != LOST]
    if not live or not all(c.get("endpoint") for c in live):
        return None
    listing = [{"id": c["id"], "node": c.get("node"), "endpoint": c["endpoint"]} for c in live]
    data = {"token": mint(bearer, [c["id"] for c in live], _epoch(expires_at), nonce),
            "children": json.dumps(listing, separators=(",", ":"))}
    endpoints = {c["endpoint"] for c in live}
    if len(endpoints) == 1:
        data["endpoint"] = endpoints.pop()
    return data


def publish_token(body: Mapping[str, Any], status: dict[str, Any]) -> None:
    """Write (or refresh) the claim's Secret and name it in `status` (tokenSecret)."""
    bearer = settings().token_value
    meta = body.get("metadata") or {}
    data = secret_data(status.get("children") or [], bearer, status.get("expiresAt"), str(meta.get("uid") or "")) \
        if bearer else None
    if data is None:
        status.pop("tokenSecret", None)
        return
    from forkd.operator.kube import kube

    name = secret_name(str(meta.get("name")))
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkClaim", "name": meta.get("name"),
             "uid": meta.get("uid"), "controller": True, "blockOwnerDeletion": False}
    fresh = not (body.get("status") or {}).get("tokenSecret")  # never written for this claim: create, no look
    kube().put_secret(str(meta.get("namespace")), name, data, owner, {LABEL: str(meta.get("name"))}, fresh)
    status["tokenSecret"] = name


def drop_token(body: Mapping[str, Any]) -> None:
    """The claim is being deleted: its Secret goes too (the owner reference does it where a garbage collector
    runs; this does it at once)."""
    meta = body.get("metadata") or {}
    if not (body.get("status") or {}).get("tokenSecret"):
        return
    from forkd.operator.kube import kube

    kube().delete_secret(str(meta.get("namespace")), secret_name(str(meta.get("name"))))
