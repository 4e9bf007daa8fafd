"""One Kubernetes status from the statuses of a resource's objects on several node daemons (pure: dicts in, a dict
out; table-tested).

- Conditions: those of the first node (by name) that is not Ready, else of the first node, so Ready means Ready
  everywhere and a reason is always one node's own.
- ForkPool: warm, claimed and replicas summed; target is the resource's spec.warm; `nodes` lists each node's share
  (target) and its counts; `node` names the node when the pool is on one.
- ForkClaim: the children of every node, each with its node and that daemon's endpoint (its URL; none for a unix
  socket); children the previous status placed on a node that has left are kept, with status `lost`, and make the
  claim Degraded (reason NodeLost) and not Ready: they are reported, never silently dropped. A claim Ready on
  several nodes says how many children it holds on which nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

LOST = "lost"


def now() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cond(type_: str, status: str, reason: str, message: str, previous: Mapping[str, Any]) -> dict[str, str]:
    """A condition, keeping its lastTransitionTime from `previous` (a status) while its status is unchanged."""
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or now()}


def is_ready(st: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def shown(per_node: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The status whose conditions speak for all: the first node's that is not Ready, else the first node's."""
    names = sorted(per_node)
    pick = next((n for n in names if not is_ready(per_node[n])), names[0] if names else None)
    return dict(per_node[pick]) if pick is not None else {}


def pool_status(per_node: Mapping[str, Mapping[str, Any]], shares: Mapping[str, int], warm: int) -> dict[str, Any]:
    out = shown(per_node)
    for key in ("warm", "claimed", "replicas"):
        out[key] = sum(int(st.get(key) or 0) for st in per_node.values())
    out["target"] = warm
    out["nodes"] = [{"node": n, "target": int(shares.get(n, 0)), "warm": int(st.get("warm") or 0),
                     "claimed": int(st.get("claimed") or 0)} for n, st in sorted(per_node.items())]
    holding = [n for n in sorted(per_node) if shares.get(n, 0) > 0] or sorted(per_node)
    if len(holding) == 1:
        out["node"] = holding[0]
    else:
        out.pop("node", None)
    return out


def endpoint_of(address: str) -> str | None:
    """A daemon's address as a pod can use it: its URL (a unix socket path is only the node's own)."""
    return address if address.startswith(("http://", "https://")) else None


def claim_status(per_node: Mapping[str, Mapping[str, Any]], known: Mapping[str, str],
                 previous: Mapping[str, Any]) -> dict[str, Any]:
    out = shown(per_node) if per_node else {k: v for k, v in previous.items() if k in ("claimedAt", "expiresAt")}
    children: list[dict[str, Any]] = []
    for node, st in sorted(per_node.items()):
        for child in st.get("children") or []:
            c = {**child, "node": node}
            if endpoint_of(known.get(node, "")):
                c["endpoint"] = known[node]
            children.append(c)
    lost = [{**c, "status": LOST} for c in previous.get("children") or [] if c.get("node") and c["node"] not in known]
    out["children"] = children + lost
    out["claimed"] = sum(int(st.get("claimed") or 0) for st in per_node.values())
    for key, pick in (("claimedAt", min), ("expiresAt", min)):
        times = [st[key] for st in per_node.values() if st.get(key)]
        if times:
            out[key] = pick(times)
    out.pop("node", None)
    if len(per_node) == 1 and not lost:
        out["node"] = next(iter(per_node))
    if lost:
        gone = sorted({c["node"] for c in lost})
        msg = (f"children {', '.join(c['id'] for c in lost)} were on node(s) {', '.join(gone)}, which left the "
               f"cluster: they are lost (delete this claim and claim again for new ones)")
        out["conditions"] = [cond("Ready", "False", "NodeLost", msg, previous),
                             cond("Reconciling", "False", "NodeLost", "", previous),
                             cond("Degraded", "True", "NodeLost", msg, previous)]
    elif not per_node:
        out["conditions"] = [cond("Ready", "Unknown", "Pending", "placed on no node yet", previous)]
    elif len(per_node) > 1 and is_ready(out):  # one node's message counts only its own children: say all
        msg = f"{len(children)} children on nodes {', '.join(sorted(per_node))}"
        out["conditions"] = [dict(c, message=msg) if c.get("type") == "Ready" else c for c in out["conditions"]]
    return out
