"""kopf handlers for ForkParent, ForkLayer, ForkPool, ForkBranch and ForkClaim (group forkd.dev, version v1alpha1).

There is no second reconciler here. A custom resource is translated into the same spec model `forkd apply` takes
(spec + metadata.name and namespace; the Kubernetes generation rides along as an annotation) and applied to a
node-local forkd daemon through its API (forkd.client.RemoteBackend); the daemon's reconcile loop builds
snapshots and keeps pools warm, and the status it computes is copied back into the resource's `status`.

- Level-triggered: create / update / resume handlers, plus a timer per object (every FORKD_OPERATOR_INTERVAL
  seconds, default 10) that re-applies (a no-op when nothing changed: the daemon says "unchanged") and copies the
  status again. A daemon restart or lost object is healed by the next tick.
- Ownership: the daemon records `forkd.dev/managed-by: operator` on what the operator applies and refuses (409)
  a CLI apply over it, and vice versa; the operator reports such a conflict in the resource's conditions and
  retries. The daemon keys objects by namespace/name as Kubernetes does, so two namespaces may use the same name on
  one node (what the objects make there is namespace-qualified: forkd.spec.namespaces).
- Finalizer (kopf adds it because of the delete handler): a ForkPool is scaled to zero through the daemon and the
  handler waits until its idle children are retired, then the object is deleted from the daemon (which releases
  its snapshot when nothing uses it any more). Claimed children stay until their ttl ends, as with `forkd delete`.
- Events: the daemon's events of an object (Applied, SpawnChildren, Failed, SourceNotFound, ...) are published as
  Kubernetes Events on the resource through kopf's event API (kopf.event: Normal and Warning alike), each once (the
  newest time posted is remembered per resource and node; events older than the operator process are not posted).
- Errors: InvalidInput -> kopf.PermanentError (the spec will not become valid by waiting); every other ForkdError,
  including an unreachable daemon, -> kopf.TemporaryError(delay=FORKD_OPERATOR_RETRY, default 10 s).

Which daemons (placement): FORKD_NODES="node-a=/path/a.sock,node-b=http://NODE-B-ADDRESS:8889" names the node
daemons (one per node: the DaemonSet), each by its unix socket or its TCP URL (bearer token from FORKD_TOKEN);
without it there is one node, the daemon on FORKD_DAEMON_SOCKET (default $FORKD_HOME/forkd.sock). ForkParents
and ForkLayers go to every node (each node builds the snapshots its pools fork from); a ForkPool goes to one
node where it fits: each daemon reports its available memory and running children (GET /v1/node), the pool needs
warm x (spec.child.memoryLimitMiB or FORKD_PLACEMENT_CHILD_MIB), and among the nodes that fit the one with the most
available memory (in steps of 256 MiB) wins, rendezvous hashing of namespace/name breaking ties (stable, spreads pools).
A placed pool stays where it is (status.node, or the node whose daemon holds it). No node fits: Degraded, reason
NoCapacity, retried. The annotation `forkd.dev/node` pins any resource to a node; a ForkBranch of `pool/<name>`
goes where that pool is, a branch of a child id needs the annotation; a ForkClaim goes where its pool is (deleting
it kills its children there). The chosen node is reported in `status.node`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
import pydantic

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound, Unavailable, first_line
from forkd.base.paths import Layout
from forkd.base.settings import read_one, settings
from forkd.client.remote import RemoteBackend
from forkd.operator.crdgen import GROUP, VERSION, plural
from forkd.reconciler.control import managed_by
from forkd.reconciler.objects import MANAGED_BY
from forkd.reconciler.objects import key as daemon_key
from forkd.spec.models import API_VERSION, KINDS, MODELS, ForkObject
from forkd.spec.namespaces import DEFAULT as DEFAULT_NAMESPACE
from forkd.spec.namespaces import check_references, qname

MANAGER = "operator"
NAMESPACE_KEY = "forkd.dev/k8s-namespace"
GENERATION_KEY = "forkd.dev/k8s-generation"
NODE_KEY = "forkd.dev/node"
FINALIZER = "forkd.dev/finalizer"
# read once, at import (kopf registers its timers with them); read_one(): another variable's bad value must not stop it
INTERVAL: float = read_one("operator_interval")
RETRY: float = read_one("operator_retry")
DELETE_WAIT: float = read_one("operator_delete_wait")  # per attempt of the delete handler

_clients: dict[str, RemoteBackend] = {}
_clients_lock = threading.Lock()
_STARTED = time.time()
_posted: dict[str, float] = {}  # "uid@node" -> time of the newest daemon event published as a Kubernetes Event
_posted_lock = threading.Lock()


def nodes() -> dict[str, str]:
    """Node name -> its daemon's socket, from FORKD_NODES (default: one node, "local")."""
    raw = settings().nodes.strip()
    if not raw:
        return {"local": daemon_socket()}
    out: dict[str, str] = {}
    for item in raw.split(","):
        name, _, sock = item.strip().partition("=")
        if not name or not sock:
            raise InvalidInput(f"FORKD_NODES entry {item!r}: use NAME=SOCKET or NAME=http://HOST:PORT")
        out[name] = sock
    return out


def _score(node: str, key: str) -> str:
    return hashlib.sha256(f"{node}|{key}".encode()).hexdigest()


def _rendezvous(candidates: list[str], key: str) -> str:
    return max(sorted(candidates), key=lambda n: _score(n, key))


STEP_MIB = 256  # available memory is compared in these steps: a few MiB of noise must not decide placement


class NoCapacity(Conflict):
    """No node has room for a pool: the resource is Degraded with reason NoCapacity, and retried."""


def pool_need_mib(body: Mapping[str, Any]) -> int:
    """Memory a pool asks of its node: warm children x (spec.child.memoryLimitMiB, or FORKD_PLACEMENT_CHILD_MIB)."""
    spec = body.get("spec") or {}
    per_child = (spec.get("child") or {}).get("memoryLimitMiB") or settings().placement_child_mib
    return int(spec.get("warm") or 0) * int(per_child)


def _holder(known: Mapping[str, str], kind: str, name: str, namespace: str) -> str | None:
    """The node whose daemon already holds `kind/name` of `namespace` (an object placed before), or None when every
    node answered that it does not. A node that cannot be asked might hold it: Unavailable (retried), never "no"
    (that would place the object a second time)."""
    for node in sorted(known):
        try:
            objs = daemon(known[node]).get(kind, name)
        except NotFound:
            continue
        except ForkdError as exc:
            raise Unavailable(f"node {node} did not answer whether it holds {kind}/{name} of namespace {namespace} "
                              f"({first_line(exc)}): placing it now could place it twice",
                              hint=f"retried; bring node {node} back, or remove it from FORKD_NODES") from exc
        if objs and (objs[0].metadata.annotations or {}).get(NAMESPACE_KEY, namespace) == namespace:
            return node
    return None


def _place_pool(body: Mapping[str, Any], known: Mapping[str, str], namespace: str) -> str:
    """Where a pool stays (status.node, or the node already holding it) or goes: among the nodes whose available
    memory fits its need, the one with the most (in steps of STEP_MIB); rendezvous hashing of namespace/name breaks
    ties.
    NoCapacity if none fits (unreachable nodes do not count)."""
    name = str(_meta(body).get("name"))
    current = (body.get("status") or {}).get("node")
    if current in known:
        return str(current)
    held = _holder(known, "ForkPool", name, namespace)
    if held is not None:
        return held
    need = pool_need_mib(body)
    caps: dict[str, int] = {}
    for node, endpoint in known.items():
        try:
            caps[node] = int(daemon(endpoint).capacity().get("memoryAvailableMiB", 0))
        except ForkdError as exc:
            logging.getLogger("forkd.operator").warning("placement: node %s unreachable: %s", node, exc)
    fits = [n for n, avail in caps.items() if avail >= need]
    if not fits:
        seen = ", ".join(f"{n}: {caps[n]} MiB" for n in sorted(caps)) or "no node answered"
        raise NoCapacity(f"ForkPool/{name} needs {need} MiB ({(body.get('spec') or {}).get('warm') or 0} warm "
                         f"children) and no node has that much available ({seen})",
                         hint="lower spec.warm or spec.child.memoryLimitMiB, or add a node (FORKD_NODES)")
    key = f"{namespace}/{name}"
    return max(sorted(fits), key=lambda n: (caps[n] // STEP_MIB, _score(n, key)))


def _pool_node(known: Mapping[str, str], namespace: str, pool: str) -> str:
    """Where a pool is (for its branches and claims): the node holding it, else where hashing would put it."""
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
    if kind == "ForkClaim":  # where its pool is
        return [_pool_node(known, namespace, str((body.get("spec") or {}).get("pool")))]
    return [_place_pool(body, known, namespace)]


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


# -- translation ------------------------------------------------------------------------------------------
def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def to_model(body: Mapping[str, Any]) -> ForkObject:
    """A custom resource (as kopf passes it) -> the spec model the daemon applies. Raises InvalidInput (for a
    reference outside the resource's namespace too)."""
    kind, meta = body.get("kind"), _meta(body)
    if kind not in MODELS:
        raise InvalidInput(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    doc = {"apiVersion": API_VERSION, "kind": kind,
           "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace") or DEFAULT_NAMESPACE,
                        "labels": dict(meta.get("labels") or {}),
                        "annotations": {MANAGED_BY: MANAGER, NAMESPACE_KEY: str(meta.get("namespace") or ""),
                                        GENERATION_KEY: str(meta.get("generation") or 0)}},
           "spec": dict(body.get("spec") or {})}
    try:
        obj = MODELS[kind].model_validate(doc)
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise InvalidInput(f"{kind}/{meta.get('name')}: {problems}") from None
    check_references(obj)  # before placement looks anything up by the names it gives
    return obj


def _source(body: Mapping[str, Any]) -> str:
    meta = _meta(body)
    return f"kubernetes:{meta.get('namespace') or '-'}/{plural(str(body.get('kind')))}/{meta.get('name')}"


def _applyset(body: Mapping[str, Any]) -> str:
    return f"k8s-{_meta(body).get('namespace') or 'cluster'}"


def _now() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def k8s_status(obj: ForkObject, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resource's status from the daemon's object: its numbers and conditions; observedGeneration is the
    Kubernetes generation the daemon's status was computed from (absent while the daemon has not caught up)."""
    previous = previous or {}
    st = obj.status
    if st is None:  # applied, not reconciled yet
        out: dict[str, Any] = {"conditions": [
            _cond("Ready", "Unknown", "Pending", "applied to the node daemon, waiting for its reconcile loop",
                  previous),
            _cond("Reconciling", "True", "Pending", "", previous),
            _cond("Degraded", "False", "AsExpected", "", previous)]}
    else:
        out = st.model_dump(mode="json", exclude_none=True)
        out.pop("observedGeneration", None)
        if st.observedGeneration is not None and st.observedGeneration == obj.metadata.generation:
            out["observedGeneration"] = int(obj.metadata.annotations.get(GENERATION_KEY) or 0)
    if "observedGeneration" not in out and previous.get("observedGeneration") is not None:
        out["observedGeneration"] = previous["observedGeneration"]
    return out


def _cond(type_: str, status: str, reason: str, message: str, previous: Mapping[str, Any]) -> dict[str, str]:
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since or _now()}


def error_status(exc: ForkdError, generation: int | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    """Conditions saying why the resource cannot be reconciled right now."""
    reason = "InvalidSpec" if isinstance(exc, InvalidInput) else "NoCapacity" if isinstance(exc, NoCapacity) \
        else "Conflict" if isinstance(exc, Conflict) else "DaemonError"
    message = exc.message + (f" ({exc.hint})" if exc.hint else "")
    out: dict[str, Any] = {"conditions": [
        _cond("Ready", "False", reason, message, previous),
        _cond("Reconciling", "False" if reason == "InvalidSpec" else "True", reason, "" if reason == "InvalidSpec"
              else f"retrying every {RETRY:.0f}s", previous),
        _cond("Degraded", "True", reason, message, previous)]}
    if reason == "InvalidSpec" and generation is not None:
        out["observedGeneration"] = generation  # seen, and it is wrong: waiting will not help
    elif previous.get("observedGeneration") is not None:
        out["observedGeneration"] = previous["observedGeneration"]
    return out


def patch_status(patch: Any, current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
    """Put into `patch.status` only what differs (a merge patch: removed keys become None)."""
    current = current or {}
    for key, value in new.items():
        if current.get(key) != value:
            patch.status[key] = value
    for key in current:
        if key not in new:
            patch.status[key] = None


def _raise(exc: ForkdError) -> None:
    if isinstance(exc, InvalidInput):
        raise kopf.PermanentError(str(exc)) from exc
    raise kopf.TemporaryError(str(exc), delay=RETRY) from exc


def _owner_check(backend: RemoteBackend, obj: ForkObject, namespace: str) -> None:
    """An operator-managed daemon object of the same kind and name from another namespace is not ours."""
    try:
        cur = backend.get(obj.kind, daemon_key(obj))[0]
    except NotFound:
        return
    other = cur.metadata.annotations.get(NAMESPACE_KEY)
    if managed_by(cur) == MANAGER and other is not None and other != namespace:
        raise Conflict(f"{obj.kind}/{obj.metadata.name} on this node is managed by the operator for namespace "
                       f"{other!r}", hint="names must be unique across namespaces on one node")


# -- the handlers ---------------------------------------------------------------------------------------------
def reconcile(body: Mapping[str, Any], patch: Any, logger: logging.Logger | logging.LoggerAdapter | None = None,
              status: Mapping[str, Any] | None = None, backend: RemoteBackend | None = None,
              settle: float = 3.0, **_: Any) -> None:
    """Create / update / resume / timer: apply the resource to its node daemon(s), copy the status back (from
    the first node that is not Ready, else the first node)."""
    log = logger or logging.getLogger("forkd.operator")
    status = status if status is not None else body.get("status") or {}
    meta = _meta(body)
    try:
        obj = to_model(body)
        targets = [(None, backend)] if backend is not None else [(n, daemon(nodes()[n])) for n in place(body)]
        shown: dict[str, Any] | None = None
        for node, b in targets:
            new = _apply_on(b, obj, body, meta, status, settle, log)
            publish_events(b, obj, body, node or "local", log)
            if node is not None and obj.kind in ("ForkPool", "ForkBranch", "ForkClaim"):
                new["node"] = node
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in new.get("conditions", []))
            if shown is None or (not ready and _is_ready(shown)):
                shown = new
        patch_status(patch, status, shown or {})
    except ForkdError as exc:
        patch_status(patch, status, error_status(exc, meta.get("generation"), status))
        log.warning("%s/%s: %s", body.get("kind"), meta.get("name"), exc)
        _raise(exc)


def _is_ready(st: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions", []))


def _apply_on(b: RemoteBackend, obj: ForkObject, body: Mapping[str, Any], meta: Mapping[str, Any],
              status: Mapping[str, Any], settle: float, log) -> dict[str, Any]:
    _owner_check(b, obj, str(meta.get("namespace") or ""))
    change = b.apply([(obj, _source(body))], _applyset(body), manager=MANAGER)[0]
    if change.change != "unchanged":
        log.info("%s/%s %s on the node daemon (generation %s)", obj.kind, obj.metadata.name, change.change,
                 meta.get("generation"))
    cur = b.get(obj.kind, daemon_key(obj))[0]
    deadline = time.monotonic() + settle
    while (cur.status is None or cur.status.observedGeneration != cur.metadata.generation) \
            and time.monotonic() < deadline:  # the daemon's loop was woken by the apply: one pass
        time.sleep(0.2)
        cur = b.get(obj.kind, daemon_key(obj))[0]
    return k8s_status(cur, status)


def publish_events(b: RemoteBackend, obj: ForkObject, body: Mapping[str, Any], node: str, log) -> int:
    """Post the daemon's new events of `obj` as Kubernetes Events on the resource (kopf.event). Returns how many;
    0 outside a running kopf operator (no event queue), where there is no API server to post to."""
    key = f"{_meta(body).get('uid') or _source(body)}@{node}"
    with _posted_lock:
        since = _posted.get(key, _STARTED)
    events = [e for e in b.describe(obj.kind, daemon_key(obj)).get("events") or [] if e.get("time", 0) > since]
    try:
        for e in events:
            kopf.event(dict(body), type="Warning" if e.get("type") == "Warning" else "Normal",
                       reason=str(e.get("reason") or "Event")[:128],
                       message=(f"[{node}] " if node != "local" else "") + str(e.get("message") or "")[:1024])
    except LookupError:  # not inside kopf's operator: no event queue
        log.debug("no kopf event queue: %d event(s) of %s/%s not posted", len(events), obj.kind, obj.metadata.name)
        return 0
    if events:
        with _posted_lock:
            _posted[key] = max(e.get("time", 0) for e in events)
    return len(events)


def _idle_children(backend: RemoteBackend, pool: str) -> list[dict[str, Any]]:
    info = backend.describe("ForkPool", pool)
    return [c for c in info.get("children") or [] if not c.get("claimed")]


def release(body: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter | None = None,
            backend: RemoteBackend | None = None, wait: float | None = None, **_: Any) -> None:
    """Delete (the finalizer): release what the daemon holds for this resource, then let Kubernetes delete it.

    Objects the operator does not manage (the CLI's, another namespace's) are left alone."""
    if backend is None:  # every node: placement may have changed since the object was applied
        for sock in nodes().values():
            release(body, logger=logger, backend=daemon(sock), wait=wait)
        return
    log = logger or logging.getLogger("forkd.operator")
    kind, meta = str(body.get("kind")), _meta(body)
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
    name = qname(namespace or DEFAULT_NAMESPACE, name)  # the daemon's key: the name in its namespace
    b = backend
    try:
        try:
            cur = b.get(kind, name)[0]
        except NotFound:
            return
        if managed_by(cur) != MANAGER or cur.metadata.annotations.get(NAMESPACE_KEY, namespace) != namespace:
            log.info("%s/%s on the node daemon is not managed by this resource; leaving it", kind, name)
            return
        if kind == "ForkPool":
            if cur.spec.warm != 0:  # scale to zero through the reconciler: it retires the idle children
                zero = cur.model_copy(update={"spec": cur.spec.model_copy(update={"warm": 0}), "status": None})
                b.apply([(zero, _source(body))], _applyset(body), manager=MANAGER)
            deadline = time.monotonic() + (DELETE_WAIT if wait is None else wait)
            while idle := _idle_children(b, name):
                if time.monotonic() > deadline:
                    raise kopf.TemporaryError(f"waiting for {len(idle)} children of pool {name} to be retired",
                                              delay=5)
                time.sleep(0.3)
        b.delete(kind, name)
        log.info("%s/%s deleted from the node daemon", kind, name)
    except NotFound:
        return
    except ForkdError as exc:
        _raise(exc)


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep kopf's bookkeeping in annotations (the status schema is structural: it has no room for it)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="operator.forkd.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="operator.forkd.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING


def register(registry: kopf.OperatorRegistry | None = None) -> kopf.OperatorRegistry:
    """Register the handlers of every kind (into kopf's default registry unless one is given)."""
    reg = registry or kopf.get_default_registry()
    kopf.on.startup(registry=reg)(configure)
    for kind in KINDS:
        res = {"group": GROUP, "version": VERSION, "plural": plural(kind), "registry": reg}
        kopf.on.create(**res, id="reconcile-create")(reconcile)
        kopf.on.update(**res, id="reconcile-update")(reconcile)
        kopf.on.resume(**res, id="reconcile-resume")(reconcile)
        kopf.timer(**res, id="reconcile-timer", interval=INTERVAL, initial_delay=INTERVAL)(reconcile)
        kopf.on.delete(**res, id="release")(release)
    return reg
