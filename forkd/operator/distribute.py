"""Build once, distribute by content: with FORKD_OPERATOR_REGISTRY set, a ForkParent or ForkLayer is built on one
node (its builder, chosen by rendezvous hashing and kept while it stays), pushed from there to the registry as a
snapshot artifact (forkd.core.pack.oci), and every other node pulls that artifact by digest, verifies it and only
then gets the object applied, so its reconciler finds the snapshot ready and builds nothing: every node forks the
same bytes. The status records the artifact and, per node, the digest it holds and how it got it.

A pull is owned (forkd.core.pack.oci): the operator pinned the digest its builder reported, so the snapshot keeps
the tag and labels the reconciler gave it there, and is released with the object as a local build would be. A
node that already holds the snapshot from this artifact (its forkd.dev/source label) is not pulled again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from forkd.base.errors import ForkdError
from forkd.base.settings import settings
from forkd.client.remote import RemoteBackend
from forkd.operator.combine import is_ready, shown
from forkd.operator.placement import _rendezvous

KINDS = ("ForkParent", "ForkLayer")
SOURCE_LABEL = "forkd.dev/source"

Apply = Callable[[str, Any], dict[str, Any]]  # (node, object) -> its Kubernetes status there
Daemon = Callable[[str], RemoteBackend]  # node -> its daemon


def repository() -> str:
    """FORKD_OPERATOR_REGISTRY: the repository prefix artifacts are pushed under ('' : distribution is off)."""
    return settings().operator_registry.strip().rstrip("/")


def applies(obj: Any, known: Mapping[str, str], pinned: bool) -> bool:
    """Whether `obj` is distributed rather than built on every node."""
    return bool(repository()) and obj.kind in KINDS and len(known) > 1 and not pinned


def _options() -> Any:
    from forkd.client.wire import RegistryPull

    host = repository().partition("/")[0]
    insecure = {h.strip() for h in settings().insecure_registries.split(",") if h.strip()}
    return RegistryPull(tls_verify=host not in insecure)


def builder(known: Mapping[str, str], key: str, previous: Mapping[str, Any]) -> str:
    """The node that builds: the previous builder while it is still known, else by rendezvous over the nodes."""
    before = previous.get("builtOn")
    return before if before in known else _rendezvous(sorted(known), key)


def artifact_ref(snapshot: str) -> str:
    """Where a snapshot is pushed: REPOSITORY/<snapshot tag>:<snapshot tag> (one repository per snapshot name)."""
    return f"{repository()}/{snapshot.replace('_', '-').lower()}:{snapshot}"


def _holds(b: RemoteBackend, tag: str, pinned: str) -> bool:
    """Whether the node already holds `tag` ready, from the artifact `pinned` (its source label)."""
    try:
        info = b.snapshot_info(tag)
    except ForkdError:
        return False
    labels = info.get("labels") or {}
    return info.get("status") == "ready" and labels.get(SOURCE_LABEL) == "oci:" + pinned.removeprefix("docker://")


def reconcile(obj: Any, key: str, known: Mapping[str, str], previous: Mapping[str, Any], apply: Apply,
              daemon: Daemon, log: logging.Logger | logging.LoggerAdapter) -> dict[str, Any]:
    """Build `obj` on its builder, push it once, have every other node pull it by digest before the object is
    applied there; the combined status with `distribution`."""
    from forkd.client.wire import SnapshotPullRequest, SnapshotPushRequest

    dist = dict(previous.get("distribution") or {})
    home = builder(known, key, dist)
    per_node = {home: apply(home, obj)}
    st = per_node[home]
    tag = st.get("snapshot") if is_ready(st) else None
    if tag is None:  # still building: no other node gets the object yet (it would build it itself)
        out = shown(per_node)
        out["distribution"] = None
        return out
    if dist.get("snapshot") != tag or dist.get("builtOn") != home or not dist.get("digest"):
        res = daemon(home).snapshot_push(SnapshotPushRequest(tag=tag, ref=artifact_ref(tag), owned=True,
                                                             registry=_options()))
        log.info("%s/%s: pushed %s from %s as %s", obj.kind, obj.metadata.name, tag, home, res["pinned"])
        dist = {"snapshot": tag, "builtOn": home, "ref": res["pinned"], "digest": res["digest"], "nodes": []}
    copies = {c["node"]: c for c in dist.get("nodes") or [] if c.get("node") in known}
    copies[home] = {"node": home, "digest": dist["digest"], "via": "built"}
    for node in sorted(set(known) - {home}):
        b = daemon(node)
        if not _holds(b, tag, dist["ref"]):
            res = b.snapshot_pull(SnapshotPullRequest(ref=dist["ref"], owned=True, registry=_options()))
            log.info("%s/%s: %s pulled %s (%s)", obj.kind, obj.metadata.name, node, dist["ref"],
                     ", ".join(res.get("installed") or []) or "already there")
        copies[node] = {"node": node, "digest": dist["digest"], "via": "pulled"}
        per_node[node] = apply(node, obj)
    out = shown(per_node)
    out["distribution"] = {**dist, "nodes": [copies[n] for n in sorted(copies)]}
    return out
