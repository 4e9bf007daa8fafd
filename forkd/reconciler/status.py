"""compute_status(desired, actual, previous) -> {"Kind/name": status}: what `forkd get` shows.

Pure: time is `actual.now`, and statuses read the same World (forkd.reconciler.world) plan() does. Kubernetes
conventions: observedGeneration is the generation the statuses were computed from (always the current one: they
are computed from the current spec), and the conditions Ready / Reconciling / Degraded / Stalled (kstatus' and
Flux's "cannot progress until the spec changes"; its reason and message are Degraded's), plus Expired on a
ForkClaim, each "True" or "False" with a CamelCase reason and a message. A condition keeps its lastTransitionTime
from `previous` while its status does not change.
"""

from __future__ import annotations

from datetime import UTC, datetime

from forkd.reconciler.state import Actual, Desired, Failure
from forkd.reconciler.world import LIVE, World, chain_depth, claim_shutdown, resolve
from forkd.spec.models import (
    ClaimedChild,
    Condition,
    ForkBranch,
    ForkBranchStatus,
    ForkClaim,
    ForkClaimStatus,
    ForkLayer,
    ForkLayerStatus,
    ForkObject,
    ForkParent,
    ForkParentStatus,
    ForkPool,
    ForkPoolStatus,
    Status,
    spec_hash,
)

Cond = tuple[bool, str, str]  # (status, reason, message)
OK: Cond = (False, "AsExpected", "")


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(key: str, ready: Cond, reconciling: Cond, degraded: Cond, previous: dict[str, Status | None],
                stamp: str) -> list[Condition]:
    """The three conditions; `stamp` (now, RFC 3339) is the lastTransitionTime of those whose status changed."""
    prev = previous.get(key)
    return [_condition(type_, c, prev, stamp)
            for type_, c in (("Ready", ready), ("Reconciling", reconciling), ("Degraded", degraded))]


def _condition(type_: str, cond: Cond, prev: Status | None, stamp: str) -> Condition:
    flag, reason, message = cond
    status = "True" if flag else "False"
    old = prev.condition(type_) if prev is not None else None
    since = old.lastTransitionTime if old is not None and old.status == status and old.lastTransitionTime else ""
    return Condition(type=type_, status=status, reason=reason, message=message, lastTransitionTime=since or stamp)


def _with_stalled(key: str, st: Status, w: World, previous: dict[str, Status | None], stamp: str) -> Status:
    """Add the Stalled condition: True (with Degraded's reason and message) when `key` cannot progress until its
    spec, or what it names, changes."""
    deg = st.condition("Degraded")
    cond: Cond = (True, deg.reason, deg.message) if w.stalled(key) and deg is not None else OK
    return st.model_copy(update={"conditions": [*st.conditions, _condition("Stalled", cond, previous.get(key),
                                                                           stamp)]})


def _failed(what: str, f: Failure | None, fallback: str | None, now: float) -> str:
    msg = f.message if f is not None else (fallback or f"{what} failed")
    if f is None:
        return msg
    if f.terminal:
        when = "not retried until the spec changes"
    else:
        when = f"next retry at {rfc3339(f.retry_at)}" if now < f.retry_at else "retrying now"
    return f"{msg} (attempt {f.attempts}; {when})"


def _given_up(key: str, f: Failure | None, w: World) -> bool:
    """The object's action failed with a TerminalError and nothing else runs for it: not reconciling."""
    return f is not None and f.terminal and key not in w.in_flight


def parent_status(p: ForkParent, w: World, previous: dict[str, Status | None], stamp: str) -> ForkParentStatus:
    key, now, tag = f"ForkParent/{p.metadata.name}", w.now, w.tags[p.metadata.name]
    snap, fail = w.snaps.get(tag), w.failures.get(key)
    ready = snap is not None and snap.status == "ready"
    broken = not ready and (fail is not None or (snap is not None and snap.status == "failed"))
    if ready:
        r: Cond = (True, "SnapshotReady", f"snapshot {tag} is ready")
        rec, deg = (False, "SnapshotReady", ""), OK
    else:
        msg = _failed("build", fail, snap.error if snap else None, now) if broken else ""
        deg = (True, "BuildFailed", msg) if broken else OK
        if _given_up(key, fail, w):
            rec = (False, "BuildFailed", msg)
        elif fail is not None and now < fail.retry_at and key not in w.in_flight:
            rec = (False, "BackingOff", f"next build of {tag} at {rfc3339(fail.retry_at)}")
        else:
            rec = (True, "Building", f"building snapshot {tag}")
        r = (False, "BuildFailed", msg) if broken else (False, "Building", f"snapshot {tag} is not built yet")
    return ForkParentStatus(observedGeneration=p.metadata.generation, snapshot=tag if ready else None,
                            specHash=spec_hash(p), conditions=_conditions(key, r, rec, deg, previous, stamp))


def layer_status(la: ForkLayer, w: World, previous: dict[str, Status | None], stamp: str) -> ForkLayerStatus:
    key, now = f"ForkLayer/{la.metadata.name}", w.now
    if (stuck := w.stuck.get(key)) is not None:
        c: Cond = (False, stuck.reason, stuck.message)
        return ForkLayerStatus(observedGeneration=la.metadata.generation,
                               conditions=_conditions(key, c, c, (True, *c[1:]), previous, stamp))
    tag, src_tag = w.tags[la.metadata.name], w.tags[la.spec.from_]
    snap, fail = w.snaps.get(tag), w.failures.get(key)
    ready = snap is not None and snap.status == "ready"
    broken = not ready and (fail is not None or (snap is not None and snap.status == "failed"))
    msg = _failed("build", fail, snap.error if snap else None, now) if broken else ""
    if ready:
        r: Cond = (True, "SnapshotReady", f"layer snapshot {tag} is ready")
        rec, deg = (False, "SnapshotReady", ""), OK
    elif not w.ready(src_tag):
        r = (False, "WaitingForSource", f"waiting for {src_tag}")
        rec = (True, "WaitingForSource", f"waiting for {src_tag}")
        deg = (True, "BuildFailed", msg) if broken else OK
    else:
        r = (False, "BuildFailed", msg) if broken else (False, "Building", f"building layer {tag}")
        rec = (False, "BuildFailed", msg) if _given_up(key, fail, w) else \
            (True, "Building", f"building layer {tag} on {src_tag}")
        deg = (True, "BuildFailed", msg) if broken else OK
    return ForkLayerStatus(observedGeneration=la.metadata.generation, snapshot=tag if ready else None,
                           chainDepth=chain_depth(tag, w.snaps) if ready else None,
                           conditions=_conditions(key, r, rec, deg, previous, stamp))


def _pool_conditions(pool: ForkPool, w: World) -> tuple[Cond, Cond, Cond]:
    """(Ready, Reconciling, Degraded) of a pool."""
    name, warm, now = pool.metadata.name, pool.spec.warm, w.now
    key, target, kids = f"ForkPool/{name}", w.targets[name], w.kids[name]
    n_current = sum(c.status == "running" for c in kids.idle_current)
    stuck = w.stuck.get(key)
    blocked: Cond | None = ((True, stuck.reason, stuck.message) if stuck is not None else
                            (True, "NetworkMismatch", w.mismatches[name]) if name in w.mismatches else None)
    fail = w.failures.get(key)
    oom = sorted(c.id for c in kids.dead if c.status == "oom-killed")
    deg = blocked or ((True, "SpawnFailed", _failed("spawn", fail, None, now)) if fail is not None else
                      (True, "ChildOOMKilled", f"{len(oom)} child(ren) went past child.memoryLimitMiB and were "
                                               f"OOM-killed: {', '.join(oom[:5])}") if oom else OK)
    if blocked is not None:
        return (False, blocked[1], blocked[2]), (False, blocked[1], blocked[2]), deg
    if not w.ready(target):
        rec: Cond = (True, "WaitingForSnapshot", f"waiting for snapshot {target} of ForkParent {pool.spec.from_}")
    elif kids.idle_old:
        rec = (True, "RollingOut", f"replacing {len(kids.idle_old)} idle children from older snapshots with {target}")
    elif len(kids.idle_current) < warm and kids.live >= pool.spec.maxChildren:  # plan_pool has no room to spawn
        rec = (True, "MaxChildrenReached", f"{n_current} of {warm} warm children ready: maxChildren "
                                           f"({pool.spec.maxChildren}) is reached by {kids.live} live children "
                                           f"({len(kids.claimed)} claimed); it refills as children are released")
    elif len(kids.idle_current) != warm or n_current != len(kids.idle_current):
        rec = (True, "Scaling", f"{n_current} of {warm} warm children ready")
    else:
        rec = (False, "WarmPoolReady", "")
    if w.ready(target) and n_current >= warm:
        return (True, "WarmPoolReady", f"{n_current} of {warm} warm children ready on {target}"), rec, deg
    return (False, rec[1], rec[2] if rec[1] == "MaxChildrenReached" else f"{n_current} of {warm} warm children "
                                                                         "ready"), rec, deg


def pool_status(pool: ForkPool, w: World, previous: dict[str, Status | None], stamp: str) -> ForkPoolStatus:
    name = pool.metadata.name
    key, target, kids = f"ForkPool/{name}", w.targets[name], w.kids[name]
    r, rec, deg = _pool_conditions(pool, w)
    target_snap = w.snaps.get(target) if target else None
    last = None
    if target_snap is not None and target_snap.compacted_from:
        last = f"{rfc3339(target_snap.created_at)}: compacted {target_snap.compacted_from} into {target} " \
               f"({target_snap.compaction_reason or 'no reason recorded'})"
    warm = sum(c.status == "running" for c in kids.idle_current + kids.idle_old)
    return ForkPoolStatus(observedGeneration=pool.metadata.generation, warm=warm,
                          replicas=sum(c.status == "running" for c in kids.idle_current),
                          selector=f"forkd.dev/pool={name}",
                          claimed=len(kids.claimed), target=pool.spec.warm, snapshot=target,
                          chainDepth=chain_depth(target, w.snaps) if target else 0, lastCompaction=last,
                          conditions=_conditions(key, r, rec, deg, previous, stamp))


def branch_status(b: ForkBranch, w: World, previous: dict[str, Status | None], stamp: str) -> ForkBranchStatus:
    key, now, tag = f"ForkBranch/{b.metadata.name}", w.now, w.tags[b.metadata.name]
    snap, fail, src = w.snaps.get(tag), w.failures.get(key), w.sources.get(b.metadata.name)
    if snap is not None and snap.status == "ready":
        r: Cond = (True, "SnapshotReady", f"branch snapshot {tag} is ready")
        rec, deg = (False, "SnapshotReady", ""), OK
    elif snap is not None and snap.status == "writing":
        r = (False, "Branching", f"writing {tag}")
        rec, deg = (True, "Branching", f"writing {tag}"), OK
    elif (stuck := w.stuck.get(key)) is not None:  # no running sandbox to branch (World: SandboxNotFound)
        c: Cond = (False, stuck.reason, stuck.message)
        r, rec, deg = c, c, (True, *c[1:])
    else:  # not stuck: the source is running
        broken = fail is not None or (snap is not None and snap.status == "failed")
        msg = _failed("branch", fail, snap.error if snap else None, now) if broken else ""
        r = (False, "BranchFailed", msg) if broken else (False, "Branching", f"branching {src.id}")
        rec = (False, "BranchFailed", msg) if _given_up(key, fail, w) else \
            (True, "Branching", f"branching {src.id} ({b.spec.mode})")
        deg = (True, "BranchFailed", msg) if broken else OK
    return ForkBranchStatus(observedGeneration=b.metadata.generation,
                            snapshot=tag if snap is not None and snap.status == "ready" else None,
                            conditions=_conditions(key, r, rec, deg, previous, stamp))


def _claim_children(c: ForkClaim, w: World) -> list[ClaimedChild]:
    rec = w.records.get(c.metadata.name)
    out = []
    for cid in rec.children if rec is not None else ():
        ch = w.child(cid)
        out.append(ClaimedChild(id=cid, snapshot=ch.snapshot if ch else "", status=ch.status if ch else "gone",
                                agentSocket=ch.agent_socket if ch else None))
    return out


def _claim_conditions(c: ForkClaim, w: World, kids: list[ClaimedChild]) -> tuple[Cond, Cond, Cond, Cond]:
    """(Ready, Reconciling, Degraded, Expired) of a claim."""
    name, now = c.metadata.name, w.now
    key, rec = f"ForkClaim/{name}", w.records.get(name)
    ends = rec.expires_at if rec is not None else claim_shutdown(c)
    if ends is not None and ends <= now:
        gone = sum(k.status not in LIVE for k in kids)
        ex: Cond = (True, "Expired", f"released at {rfc3339(ends)}")
        rec_: Cond = (True, "Releasing", "retiring the children") if gone < len(kids) else (False, "Expired", "")
        return (False, "Expired", ex[2]), rec_, OK, ex
    not_expired: Cond = (False, "AsExpected", f"until {rfc3339(ends)}" if ends else "no expiry")
    if (stuck := w.stuck.get(key)) is not None:
        s: Cond = (False, stuck.reason, stuck.message)
        return s, s, (True, stuck.reason, stuck.message), not_expired
    if rec is not None:
        lost = [k.id for k in kids if k.status != "running"]
        if lost:
            m = f"{len(lost)} of {len(kids)} claimed children are not running: {', '.join(lost[:5])}"
            return (False, "ChildLost", m), (False, "Claimed", ""), (True, "ChildLost", m), not_expired
        return (True, "Claimed", f"{len(kids)} children of pool {c.spec.pool}"), (False, "Claimed", ""), OK, \
            not_expired
    fail = w.failures.get(key)
    deg: Cond = (True, "ClaimFailed", _failed("claim", fail, None, now)) if fail is not None else OK
    if key in w.in_flight:
        rc: Cond = (True, "Claiming", f"claiming {c.spec.count} children of pool {c.spec.pool}")
    elif any(r.name == name for r in w.stray_records):
        rc = (True, "ReleasingPrevious", "the children of an earlier claim of this name are being released")
    elif fail is not None:
        rc = (False, "ClaimFailed", deg[2]) if _given_up(key, fail, w) else \
            (True, "BackingOff", f"next claim at {rfc3339(fail.retry_at)}")
    else:
        rc = (True, "WaitingForPool", f"waiting for a ready snapshot of {c.spec.from_ or 'pool ' + c.spec.pool}")
    return (False, rc[1], rc[2]), rc, deg, not_expired


def claim_status(c: ForkClaim, w: World, previous: dict[str, Status | None], stamp: str) -> ForkClaimStatus:
    key, rec = f"ForkClaim/{c.metadata.name}", w.records.get(c.metadata.name)
    kids = _claim_children(c, w)
    r, rc, deg, ex = _claim_conditions(c, w, kids)
    ends = rec.expires_at if rec is not None else claim_shutdown(c)
    conds = _conditions(key, r, rc, deg, previous, stamp) + [_condition("Expired", ex, previous.get(key), stamp)]
    return ForkClaimStatus(observedGeneration=c.metadata.generation, conditions=conds, children=kids,
                           claimed=sum(k.status == "running" for k in kids),
                           claimedAt=rfc3339(rec.claimed_at) if rec is not None else None,
                           expiresAt=rfc3339(ends) if ends is not None else None)


STATUSES: dict[str, type[Status]] = {"ForkParent": ForkParentStatus, "ForkLayer": ForkLayerStatus,
                                     "ForkPool": ForkPoolStatus, "ForkBranch": ForkBranchStatus,
                                     "ForkClaim": ForkClaimStatus}


def refused_status(o: ForkObject, w: World, previous: dict[str, Status | None], stamp: str) -> Status:
    """An object refused for naming something outside its namespace: not ready, not reconciling, degraded (why)."""
    key = f"{o.kind}/{o.metadata.name}"
    why = w.stuck[key]
    c: Cond = (False, why.reason, why.message)
    return STATUSES[o.kind](observedGeneration=o.metadata.generation,
                            conditions=_conditions(key, c, c, (True, *c[1:]), previous, stamp))


def compute_status(desired: Desired, actual: Actual, previous: dict[str, Status | None]) -> dict[str, Status]:
    return world_status(resolve(desired, actual), previous)


def world_status(w: World, previous: dict[str, Status | None]) -> dict[str, Status]:
    """The status of every object `w` holds, by "Kind/name"."""
    stamp = rfc3339(w.now)
    out: dict[str, Status] = {}
    for p in w.parents:
        out[f"ForkParent/{p.metadata.name}"] = parent_status(p, w, previous, stamp)
    for la in w.layers:
        out[f"ForkLayer/{la.metadata.name}"] = layer_status(la, w, previous, stamp)
    for pool in w.pools:
        out[f"ForkPool/{pool.metadata.name}"] = pool_status(pool, w, previous, stamp)
    for b in w.branches:
        out[f"ForkBranch/{b.metadata.name}"] = branch_status(b, w, previous, stamp)
    for c in w.claims:
        out[f"ForkClaim/{c.metadata.name}"] = claim_status(c, w, previous, stamp)
    for o in w.refused:
        out[f"{o.kind}/{o.metadata.name}"] = refused_status(o, w, previous, stamp)
    return {key: _with_stalled(key, st, w, previous, stamp) for key, st in out.items()}
