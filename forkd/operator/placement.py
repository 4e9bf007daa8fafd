"""Where each resource goes among the node daemons (forkd.operator.discovery says which there are).

- ForkParent, ForkLayer: every node (each node builds the snapshots its pools fork from).
- ForkPool: split across nodes by capacity (forkd.operator.split.split_warm): each node's room is its available
  memory (GET /v1/node) over the pool's per-child need (spec.child.memoryLimitMiB or FORKD_PLACEMENT_CHILD_MIB),
  less its share's children not yet restored. A pool that fits one node goes to one node (the roomiest, hashing
  of namespace/name breaking ties); existing shares stay as far as they fit; a node that left keeps nothing, so
  its share is refilled elsewhere. A node that holds the pool but gets no share keeps it at warm 0 (its claimed
  children stay until their claims end). Not enough room in all: NoCapacity (Degraded, retried).
- ForkClaim: where it was placed (the nodes whose daemons hold it, and nodes that left with children in its
  status: split.placed_claim); new claims go to the nodes with warm children of the pool (split_claim). Nodes
  that left are reported, not re-placed.
- ForkBranch of `pool/<name>`: where that pool is; of a child id: the annotation forkd.dev/node.
- The annotation forkd.dev/node pins any resource to one node.
A node that cannot be asked whether it holds an object stops its placement (Unavailable, retried): "did not
answer" is never taken for "does not hold it", which would place it twice.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound, Unavailable, first_line
from forkd.base.paths import Layout
from forkd.base.settings import settings
from forkd.client.remote import RemoteBackend
from forkd.operator import discovery
from forkd.operator.split import NoRoom, node_room, placed_claim, split_claim, split_warm
from forkd.spec.namespaces import DEFAULT as DEFAULT_NAMESPACE
from forkd.spec.namespaces import qname

NAMESPACE_KEY = "forkd.dev/k8s-namespace"
NODE_KEY = "forkd.dev/node"
STEP_MIB = 256  # kept for callers comparing memory in steps
log = logging.getLogger("forkd.operator")

_clients: dict[str, RemoteBackend] = {}
_clients_lock = threading.Lock()


class NoCapacity(Conflict):
    """No node has room for a pool: the resource is Degraded with reason NoCapacity, and retried."""


def nodes() -> dict[str, str]:
    """Node name -> its daemon's socket or URL: FORKD_NODES, else the pods FORKD_NODE_PODS names, else "local"."""
    s = settings()
    if s.nodes.strip():
        return discovery.parse_nodes(s.nodes)
    if s.node_pods.strip():
        return discovery.discovered()
    return {"local": daemon_socket()}


def daemon_socket() -> str:
    return str(settings().daemon_socket or Layout.from_env().daemon_socket)


def daemon(socket_path: str | None = None) -> RemoteBackend:
    """The node daemon's API client (one per endpoint, shared by handler threads): a unix socket path, or an
    http(s) URL of a daemon serving TCP (`forkd serve --bind`) with the bearer token in FORKD_TOKEN."""
    path = socket_path or daemon_socket()
    with _clients_lock:
        if path not in _clients:
            if path.startswith(("http://", "https://")):
                _clients[path] = RemoteBackend(url=path, token=settings().token_value, timeout=60.0)
            else:
                _clients[path] = RemoteBackend(path, timeout=60.0)
        return _clients[path]


def _score(node: str, key: str) -> str:
    return hashlib.sha256(f"{node}|{key}".encode()).hexdigest()


def _rendezvous(candidates: list[str], key: str) -> str:
    return max(sorted(candidates), key=lambda n: _score(n, key))


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def per_child_mib(body: Mapping[str, Any]) -> int:
    spec = body.get("spec") or {}
    return int((spec.get("child") or {}).get("memoryLimitMiB") or settings().placement_child_mib)


def pool_need_mib(body: Mapping[str, Any]) -> int:
    """Memory a pool asks of the nodes: warm children x per-child need."""
    return int((body.get("spec") or {}).get("warm") or 0) * per_child_mib(body)


def holders(known: Mapping[str, str], kind: str, name: str, namespace: str) -> dict[str, Any]:
    """node -> the daemon's object, for every node whose daemon holds `kind/name` of `namespace`. A node that
    cannot be asked might hold it: Unavailable (retried), never "no"."""
    out: dict[str, Any] = {}
    key = qname(namespace or DEFAULT_NAMESPACE, name)  # the daemon keys objects by namespace and name

    def ask(node: str) -> list[Any] | ForkdError:
        try:
            return daemon(known[node]).get(kind, key)
        except NotFound:
            return []
        except ForkdError as exc:
            return exc

    names = sorted(known)
    if len(names) > 1:  # every node at once: a claim's placement waits for the slowest answer, not their sum
        with ThreadPoolExecutor(max_workers=min(len(names), 8), thread_name_prefix="holders") as pool:
            answers = dict(zip(names, pool.map(ask, names), strict=True))
    else:
        answers = {n: ask(n) for n in names}
    for node in names:
        objs = answers[node]
        if isinstance(objs, ForkdError):
            exc = objs
            raise Unavailable(f"node {node} did not answer whether it holds {kind}/{name} of namespace {namespace} "
                              f"({first_line(exc)}): placing it now could place it twice",
                              hint=f"retried; bring node {node} back, or remove it from FORKD_NODES") from exc
        if objs and (objs[0].metadata.annotations or {}).get(NAMESPACE_KEY, namespace) == namespace:
            out[node] = objs[0]
    return out


def _holder(known: Mapping[str, str], kind: str, name: str, namespace: str) -> str | None:
    return next(iter(holders(known, kind, name, namespace)), None)


def _room(known: Mapping[str, str], per: int, held: Mapping[str, Any]) -> dict[str, int]:
    room: dict[str, int] = {}
    for node, endpoint in known.items():
        obj = held.get(node)
        assigned = obj.spec.warm if obj is not None else 0
        warm_now = obj.status.warm if obj is not None and obj.status is not None else 0
        try:
            avail = int(daemon(endpoint).capacity().get("memoryAvailableMiB", 0))
        except ForkdError as exc:  # a node that holds a share keeps it (room 0: no more), others get nothing
            log.warning("placement: node %s did not report its capacity: %s", node, exc)
            if obj is not None:
                room[node] = 0
            continue
        room[node] = node_room(avail, per, assigned, warm_now)
    return room


def pool_shares(body: Mapping[str, Any], known: Mapping[str, str], namespace: str) -> dict[str, int]:
    """node -> the pool's warm share there (0 on a node that holds it but gets none). Raises NoCapacity."""
    name = str(_meta(body).get("name"))
    warm = int((body.get("spec") or {}).get("warm") or 0)
    held = holders(known, "ForkPool", name, namespace)
    per = per_child_mib(body)
    room = _room(known, per, held)
    current = {n: o.spec.warm for n, o in held.items() if n in room}
    try:
        split = split_warm(warm, room, current, key=f"{namespace}/{name}")
    except NoRoom as exc:
        raise NoCapacity(f"ForkPool/{name} needs {warm} warm children of {per} MiB and the nodes have room for "
                         f"fewer: {exc}", hint="lower spec.warm or spec.child.memoryLimitMiB, or add a node") from None
    shares = {**{n: 0 for n in held}, **split}
    if not shares:  # warm 0 and held nowhere: one node keeps the object (and reports its status)
        if not known:
            raise NoCapacity(f"ForkPool/{name}: no node daemon is known", hint="check FORKD_NODES / FORKD_NODE_PODS")
        shares = {_rendezvous(list(known), f"{namespace}/{name}"): 0}
    return dict(sorted(shares.items()))


def claim_shares(body: Mapping[str, Any], known: Mapping[str, str], namespace: str) -> dict[str, int]:
    """node -> children of the claim it holds: where the claim was placed (its status, else the daemons holding
    it; nodes that left included: the caller reports them), else where the pool has warm children."""
    meta, spec = _meta(body), body.get("spec") or {}
    held = holders(known, "ForkClaim", str(meta.get("name")), namespace)
    placed = placed_claim((body.get("status") or {}).get("children") or [], {n: o.spec.count for n, o in held.items()})
    if placed:
        return placed
    pool = str(spec.get("pool"))
    pools = holders(known, "ForkPool", pool, namespace)
    warm = {n: (o.status.warm if o.status is not None else 0) for n, o in pools.items() if o.spec.warm > 0}
    if not warm:
        warm = {n: 0 for n in pools}
    if not warm:
        raise NotFound(f"ForkClaim/{meta.get('name')}: ForkPool/{pool} is on no node yet",
                       hint="retried; the pool must exist (and be placed) first")
    return split_claim(int(spec.get("count") or 1), warm, key=f"{namespace}/{meta.get('name')}")


def _pool_node(known: Mapping[str, str], namespace: str, pool: str) -> str:
    """Where a pool is (for its branches): the first node holding it, else where hashing would put it."""
    return _holder(known, "ForkPool", pool, namespace) or _rendezvous(list(known), f"{namespace}/{pool}")


def place(body: Mapping[str, Any]) -> list[str]:
    """The nodes a resource is applied to (see the module docstring)."""
    known = nodes()
    kind, meta = str(body.get("kind")), _meta(body)
    namespace = str(meta.get("namespace") or "")
    pin = (meta.get("annotations") or {}).get(NODE_KEY)
    if pin:
        if pin not in known:
            raise InvalidInput(f"annotation {NODE_KEY}: {pin!r} is not a known node ({', '.join(sorted(known))})")
        return [pin]
    if kind in ("ForkParent", "ForkLayer"):
        return sorted(known)
    if kind == "ForkBranch":
        sandbox = str((body.get("spec") or {}).get("sandbox") or "")
        if not sandbox.startswith("pool/"):
            if len(known) == 1:
                return list(known)
            raise InvalidInput(f"ForkBranch/{meta.get('name')}: a branch of child {sandbox!r} needs the annotation "
                               f"{NODE_KEY} naming the node that runs it")
        return [_pool_node(known, namespace, sandbox.split("/", 1)[1])]
    if kind == "ForkClaim":
        return [n for n in claim_shares(body, known, namespace) if n in known]
    return sorted(pool_shares(body, known, namespace))
