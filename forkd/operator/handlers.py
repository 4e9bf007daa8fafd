"""kopf handlers for ForkParent, ForkLayer, ForkPool, ForkBranch and ForkClaim (group forkd.dev, version v1alpha1).

There is no second reconciler here. A custom resource is translated into the same spec model `forkd apply` takes
(spec + metadata.name and namespace; the Kubernetes generation rides along as an annotation) and applied to a
node-local forkd daemon through its API (forkd.client.RemoteBackend); the daemon's reconcile loop builds
snapshots and keeps pools warm, and the status it computes is copied back into the resource's `status`.

- Level-triggered: create / update / resume handlers, plus a timer per object (every FORKD_OPERATOR_INTERVAL
  seconds, default 10) that re-applies (a no-op when nothing changed: the daemon says "unchanged") and copies the
  status again. A daemon restart or lost object is healed by the next tick. One reconcile of a resource at a time
  (forkd.operator.serial): a tick that meets a change handler's reconcile is skipped. After an apply the handler
  copies the daemon's status once it is computed for this generation and, for a claim, no longer in progress
  (settled), waiting for that a few seconds at most: a claim is Ready from its create handler, not a tick later.
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

Which daemons, and which of them each resource goes to: forkd.operator.discovery (FORKD_NODES, else the DaemonSet's
Ready pods FORKD_NODE_PODS names, else the local daemon) and forkd.operator.placement (parents and layers to every
node; a pool split across nodes by capacity; a claim where the pool has warm children). The status of a resource
on several nodes is combined into one (forkd.operator.combine: a pool's `nodes` split, a claim's children with
their node and endpoint); a claim's children get a Secret with a token scoped to them (forkd.operator.claims). With
FORKD_OPERATOR_REGISTRY set, parents and layers are built on one node and pulled by digest on the others
(forkd.operator.distribute).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
import pydantic

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound
from forkd.base.settings import read_one
from forkd.client.remote import RemoteBackend
from forkd.operator import claims, distribute, placement, serial  # noqa: F401 (placement: tests reach it here)
from forkd.operator.combine import claim_status, cond, pool_status, shown
from forkd.operator.crdgen import GROUP, VERSION, plural
from forkd.operator.placement import (  # noqa: F401 (re-exported: the tests and callers name them here)
    NAMESPACE_KEY,
    NODE_KEY,
    STEP_MIB,
    NoCapacity,
    _holder,
    _pool_node,
    _rendezvous,
    claim_shares,
    daemon,
    daemon_socket,
    nodes,
    place,
    pool_need_mib,
    pool_shares,
)
from forkd.reconciler.control import managed_by
from forkd.reconciler.objects import MANAGED_BY
from forkd.reconciler.objects import key as daemon_key
from forkd.spec.models import API_VERSION, KINDS, MODELS, ForkObject
from forkd.spec.namespaces import DEFAULT as DEFAULT_NAMESPACE
from forkd.spec.namespaces import check_references, qname

MANAGER = "operator"
GENERATION_KEY = "forkd.dev/k8s-generation"
FINALIZER = "forkd.dev/finalizer"
# read once, at import (kopf registers its timers with them); read_one(): another variable's bad value must not stop it
INTERVAL: float = read_one("operator_interval")
RETRY: float = read_one("operator_retry")
DELETE_WAIT: float = read_one("operator_delete_wait")  # per attempt of the delete handler
RELEASE_RETRY: float = read_one("operator_release_retry")  # a parent or layer still forked from: deleted after them
CANCELLATION_POLL = 1.0  # seconds between kopf's checks that a deleted resource's timer has exited
SETTLE_POLL = 0.1  # seconds between looks at the daemon's status after an apply

_STARTED = time.time()
_posted: dict[str, float] = {}  # "uid@node" -> time of the newest daemon event published as a Kubernetes Event
_posted_lock = threading.Lock()


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


def k8s_status(obj: ForkObject, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resource's status from the daemon's object: its numbers and conditions; observedGeneration is the
    Kubernetes generation the daemon's status was computed from (absent while the daemon has not caught up)."""
    previous = previous or {}
    st = obj.status
    if st is None:  # applied, not reconciled yet
        out: dict[str, Any] = {"conditions": [
            cond("Ready", "Unknown", "Pending", "applied to the node daemon, waiting for its reconcile loop",
                  previous),
            cond("Reconciling", "True", "Pending", "", previous),
            cond("Degraded", "False", "AsExpected", "", previous)]}
    else:
        out = st.model_dump(mode="json", exclude_none=True)
        out.pop("observedGeneration", None)
        if st.observedGeneration is not None and st.observedGeneration == obj.metadata.generation:
            out["observedGeneration"] = int(obj.metadata.annotations.get(GENERATION_KEY) or 0)
    if "observedGeneration" not in out and previous.get("observedGeneration") is not None:
        out["observedGeneration"] = previous["observedGeneration"]
    return out


def error_status(exc: ForkdError, generation: int | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    """Conditions saying why the resource cannot be reconciled right now; the rest of the previous status (a
    claim's children and where they are, a pool's split) is kept: an error is no news about them, and a claim whose
    children vanished from its status would be placed again."""
    reason = "InvalidSpec" if isinstance(exc, InvalidInput) else "NoCapacity" if isinstance(exc, NoCapacity) \
        else "Conflict" if isinstance(exc, Conflict) else "DaemonError"
    message = exc.message + (f" ({exc.hint})" if exc.hint else "")
    kept = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
    out: dict[str, Any] = {**kept, "conditions": [
        cond("Ready", "False", reason, message, previous),
        cond("Reconciling", "False" if reason == "InvalidSpec" else "True", reason, "" if reason == "InvalidSpec"
              else f"retrying every {RETRY:.0f}s", previous),
        cond("Degraded", "True", reason, message, previous)]}
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
    """Create / update / resume / timer: apply the resource to its node daemon(s) (a pool with each node's share,
    a claim with each node's count: forkd.operator.placement), and copy one status back (forkd.operator.combine);
    a claim's children get a Secret with a token scoped to them (forkd.operator.claims). With `backend`, only
    that daemon is used, and its status is copied as it is."""
    log = logger or logging.getLogger("forkd.operator")
    status = status if status is not None else body.get("status") or {}
    meta = _meta(body)
    if meta.get("deletionTimestamp"):  # being deleted: the finalizer's release owns it now (no re-apply)
        return
    try:
        obj = to_model(body)
        if backend is not None:
            new = _apply_on(backend, obj, body, meta, status, settle, log)
            publish_events(backend, obj, body, "local", log)
            patch_status(patch, status, new)
            return
        known = nodes()

        def on(node: str, o: ForkObject) -> dict[str, Any]:
            b = daemon(known[node])
            st = _apply_on(b, o, body, meta, status, settle, log)
            publish_events(b, o, body, node, log)
            return st

        if distribute.applies(obj, known, bool((meta.get("annotations") or {}).get(NODE_KEY))):
            new = distribute.reconcile(obj, _source(body), known, status, on, lambda n: daemon(known[n]), log)
            patch_status(patch, status, new)
            return
        targets = _targets(body, obj, known)
        per_node = {node: on(node, o) for node, o in targets.items()}
        patch_status(patch, status, _combine(body, obj, per_node, targets, known, status))
    except ForkdError as exc:
        patch_status(patch, status, error_status(exc, meta.get("generation"), status))
        log.warning("%s/%s: %s", body.get("kind"), meta.get("name"), exc)
        _raise(exc)


def _targets(body: Mapping[str, Any], obj: ForkObject, known: Mapping[str, str]) -> dict[str, ForkObject]:
    """node -> the object applied there: a pool's with that node's share of spec.warm, a claim's with that node's
    count (placement); every other kind, and a pinned resource, as it is."""
    namespace = str(_meta(body).get("namespace") or "")
    pin = (_meta(body).get("annotations") or {}).get(NODE_KEY)
    if pin:
        children = (body.get("status") or {}).get("children") or []
        if obj.kind == "ForkClaim" and pin not in known and any(c.get("node") == pin for c in children):
            return {}  # its node left: its children are reported lost (combine.claim_status), not a bad pin
        return {n: obj for n in place(body)}
    if obj.kind == "ForkPool":
        return {n: obj.model_copy(update={"spec": obj.spec.model_copy(update={"warm": k})})
                for n, k in pool_shares(body, known, namespace).items()}
    if obj.kind == "ForkClaim":
        return {n: obj.model_copy(update={"spec": obj.spec.model_copy(update={"count": k})})
                for n, k in claim_shares(body, known, namespace).items() if n in known}
    return {n: obj for n in place(body)}


def _combine(body: Mapping[str, Any], obj: ForkObject, per_node: dict[str, dict[str, Any]],
             targets: Mapping[str, ForkObject], known: Mapping[str, str], previous: Mapping[str, Any]) -> dict:
    """The resource's status from its nodes' (forkd.operator.combine); a claim's token Secret on the way."""
    if obj.kind == "ForkPool":
        return pool_status(per_node, {n: getattr(o.spec, "warm", 0) for n, o in targets.items()}, obj.spec.warm)
    if obj.kind == "ForkClaim":
        out = claim_status(per_node, known, previous)
        claims.publish_token(body, out)
        return out
    out = shown(per_node)
    if obj.kind == "ForkBranch" and len(per_node) == 1:
        out["node"] = next(iter(per_node))
    return out


def _apply_on(b: RemoteBackend, obj: ForkObject, body: Mapping[str, Any], meta: Mapping[str, Any],
              status: Mapping[str, Any], settle: float, log) -> dict[str, Any]:
    _owner_check(b, obj, str(meta.get("namespace") or ""))
    change = b.apply([(obj, _source(body))], _applyset(body), manager=MANAGER)[0]
    if change.change != "unchanged":
        log.info("%s/%s %s on the node daemon (generation %s)", obj.kind, obj.metadata.name, change.change,
                 meta.get("generation"))
    cur = b.get(obj.kind, daemon_key(obj))[0]
    deadline = time.monotonic() + settle
    while not settled(cur) and time.monotonic() < deadline:  # the daemon's loop was woken by the apply
        time.sleep(SETTLE_POLL)
        cur = b.get(obj.kind, daemon_key(obj))[0]
    return k8s_status(cur, status)


def settled(cur: ForkObject) -> bool:
    """Whether the daemon's status of `cur` is worth copying now: computed from its generation and, for a claim,
    no longer in progress (a claim's first pass says WaitingForPool or Claiming and the next, a moment later, has
    its children: copying the first would leave the claim pending until the timer's next tick)."""
    st = cur.status
    if st is None or st.observedGeneration != cur.metadata.generation:
        return False
    return cur.kind != "ForkClaim" or not any(c.type == "Reconciling" and c.status == "True" for c in st.conditions)


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


def _users(backend: RemoteBackend, source: str) -> list[str]:
    """The pools and layers on the daemon that fork from `source` (its key): deleting it first would strand them
    (a pool whose source is gone is Stalled, and its idle children are never retired)."""
    return [f"{o.kind}/{o.metadata.name}" for kind in ("ForkPool", "ForkLayer") for o in backend.get(kind)
            if daemon_key(o) != source and qname(o.metadata.namespace, o.spec.from_) == source]


def release(body: Mapping[str, Any], logger: logging.Logger | logging.LoggerAdapter | None = None,
            backend: RemoteBackend | None = None, wait: float | None = None, **_: Any) -> None:
    """Delete (the finalizer): release what the daemon holds for this resource, then let Kubernetes delete it.

    Objects the operator does not manage (the CLI's, another namespace's) are left alone. A parent or layer waits
    for the pools and layers on the node that fork from it (a `kubectl delete -f` of both deletes them at once)."""
    if backend is None:  # every node: placement may have changed since the object was applied
        for sock in nodes().values():
            release(body, logger=logger, backend=daemon(sock), wait=wait)
        if body.get("kind") == "ForkClaim":
            try:
                claims.drop_token(body)
            except ForkdError as exc:
                _raise(exc)
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
        if kind in ("ForkParent", "ForkLayer") and (users := _users(b, name)):
            raise kopf.TemporaryError(f"{kind}/{name} is still the source of {', '.join(users)} on this node: "
                                      "deleted after them", delay=RELEASE_RETRY)
        b.delete(kind, name)
        log.info("%s/%s deleted from the node daemon", kind, name)
    except NotFound:
        return
    except ForkdError as exc:
        _raise(exc)


def on_change(body: Mapping[str, Any], **kw: Any) -> None:
    """Create / update / resume: reconcile, once the resource's reconcile in flight (a timer tick) is done."""
    with serial.held(body):
        reconcile(body=body, **kw)


def on_tick(body: Mapping[str, Any], **kw: Any) -> None:
    """The timer: reconcile, unless a reconcile of the resource is in flight (forkd.operator.serial)."""
    with serial.held(body, wait=False) as got:
        if got:
            reconcile(body=body, **kw)


def on_delete(body: Mapping[str, Any], **kw: Any) -> None:
    """The finalizer: release, once the resource's reconcile in flight is done."""
    with serial.held(body):
        release(body=body, **kw)
    serial.forget(body)


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep kopf's bookkeeping in annotations (the status schema is structural: it has no room for it); release
    a deleted resource as soon as its timer has exited."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="operator.forkd.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="operator.forkd.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    # a deleted resource keeps its finalizer until its timer has exited, and kopf checks that every this many
    # seconds (60 by default): every deletion that met a timer mid-tick would wait that long for nothing
    settings.background.cancellation_polling = CANCELLATION_POLL


def register(registry: kopf.OperatorRegistry | None = None) -> kopf.OperatorRegistry:
    """Register the handlers of every kind (into kopf's default registry unless one is given)."""
    reg = registry or kopf.get_default_registry()
    kopf.on.startup(registry=reg)(configure)
    for kind in KINDS:
        res = {"group": GROUP, "version": VERSION, "plural": plural(kind), "registry": reg}
        kopf.on.create(**res, id="reconcile-create")(on_change)
        kopf.on.update(**res, id="reconcile-update")(on_change)
        kopf.on.resume(**res, id="reconcile-resume")(on_change)
        kopf.timer(**res, id="reconcile-timer", interval=INTERVAL, initial_delay=INTERVAL)(on_tick)
        kopf.on.delete(**res, id="release")(on_delete)
    return reg
