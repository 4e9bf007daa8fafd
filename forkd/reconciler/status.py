"""compute_status(desired, actual, previous) -> {"Kind/name": status}: what `forkd get` shows.

Pure: time is `actual.now`. Kubernetes conventions: observedGeneration is the generation the statuses were
computed from (always the current one: they are computed from the current spec), and three conditions, Ready /
Reconciling / Degraded, each "True" or "False" with a CamelCase reason and a message. A condition keeps its
lastTransitionTime from `previous` while its status does not change.
"""

from __future__ import annotations

from datetime import UTC, datetime

from forkd.reconciler.plan import (
    branch_source,
    chain_depth,
    children_by_pool,
    failures_by_key,
    network_mismatch,
    pool_target,
    resolve_tags,
    snapshots_by_tag,
    split_children,
    unique_by_name,
)
from forkd.reconciler.state import Actual, Desired, Failure, SnapshotState
from forkd.spec.models import (
    Condition,
    ForkBranch,
    ForkBranchStatus,
    ForkLayer,
    ForkLayerStatus,
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
    out = []
    for type_, (flag, reason, message) in (("Ready", ready), ("Reconciling", reconciling), ("Degraded", degraded)):
        status = "True" if flag else "False"
        old = prev.condition(type_) if prev is not None else None
        since = old.lastTransitionTime if old is not None and old.status == status and old.lastTransitionTime else ""
        out.append(Condition(type=type_, status=status, reason=reason, message=message,
                             lastTransitionTime=since or stamp))
    return out


def _failed(what: str, f: Failure | None, fallback: str | None, now: float) -> str:
    msg = f.message if f is not None else (fallback or f"{what} failed")
    if f is None:
        return msg
    when = f"next retry at {rfc3339(f.retry_at)}" if now < f.retry_at else "retrying now"
    return f"{msg} (attempt {f.attempts}; {when})"


def parent_status(p: ForkParent, tag: str, snaps: dict[str, SnapshotState], failures: dict[str, Failure],
                  actual: Actual, previous: dict[str, Status | None], stamp: str) -> ForkParentStatus:
    key, now = f"ForkParent/{p.metadata.name}", actual.now
    snap, fail = snaps.get(tag), failures.get(key)
    ready = snap is not None and snap.status == "ready"
    broken = not ready and (fail is not None or (snap is not None and snap.status == "failed"))
    if ready:
        r: Cond = (True, "SnapshotReady", f"snapshot {tag} is ready")
        rec, deg = (False, "SnapshotReady", ""), OK
    else:
        msg = _failed("build", fail, snap.error if snap else None, now) if broken else ""
        deg = (True, "BuildFailed", msg) if broken else OK
        if fail is not None and now < fail.retry_at and key not in actual.in_flight:
            rec = (False, "BackingOff", f"next build of {tag} at {rfc3339(fail.retry_at)}")
        else:
            rec = (True, "Building", f"building snapshot {tag}")
        r = (False, "BuildFailed", msg) if broken else (False, "Building", f"snapshot {tag} is not built yet")
    return ForkParentStatus(observedGeneration=p.metadata.generation, snapshot=tag if ready else None,
                            specHash=spec_hash(p), conditions=_conditions(key, r, rec, deg, previous, stamp))


def layer_status(la: ForkLayer, tags: dict[str, str], snaps: dict[str, SnapshotState], failures: dict[str, Failure],
                 actual: Actual, previous: dict[str, Status | None], stamp: str) -> ForkLayerStatus:
    key, now = f"ForkLayer/{la.metadata.name}", actual.now
    tag, src_tag = tags.get(la.metadata.name), tags.get(la.spec.from_)
    if tag is None or src_tag is None:
        msg = f"spec.from {la.spec.from_!r} names no ForkParent or ForkLayer (or the layers form a cycle)"
        c: Cond = (False, "SourceNotFound", msg)
        return ForkLayerStatus(observedGeneration=la.metadata.generation,
                               conditions=_conditions(key, c, c, (True, "SourceNotFound", msg), previous, stamp))
    snap, src, fail = snaps.get(tag), snaps.get(src_tag), failures.get(key)
    ready = snap is not None and snap.status == "ready"
    broken = not ready and (fail is not None or (snap is not None and snap.status == "failed"))
    msg = _failed("build", fail, snap.error if snap else None, now) if broken else ""
    if ready:
        r: Cond = (True, "SnapshotReady", f"layer snapshot {tag} is ready")
        rec, deg = (False, "SnapshotReady", ""), OK
    elif src is None or src.status != "ready":
        r = (False, "WaitingForSource", f"waiting for {src_tag}")
        rec = (True, "WaitingForSource", f"waiting for {src_tag}")
        deg = (True, "BuildFailed", msg) if broken else OK
    else:
        r = (False, "BuildFailed", msg) if broken else (False, "Building", f"building layer {tag}")
        rec = (True, "Building", f"building layer {tag} on {src_tag}")
        deg = (True, "BuildFailed", msg) if broken else OK
    return ForkLayerStatus(observedGeneration=la.metadata.generation, snapshot=tag if ready else None,
                           chainDepth=chain_depth(tag, snaps) if ready else None,
                           conditions=_conditions(key, r, rec, deg, previous, stamp))


def pool_status(pool: ForkPool, parents: dict[str, str], layers: set[str], snaps: dict[str, SnapshotState],
                failures: dict[str, Failure], children: list, actual: Actual,
                previous: dict[str, Status | None], stamp: str, net_mismatch: str | None = None) -> ForkPoolStatus:
    name, src, warm, now = pool.metadata.name, pool.spec.from_, pool.spec.warm, actual.now
    key, target = f"ForkPool/{name}", pool_target(pool, parents, snaps)
    kids = split_children(children, target, now)
    n_warm = sum(c.status == "running" for c in kids.idle_current + kids.idle_old)
    n_current = sum(c.status == "running" for c in kids.idle_current)
    target_ready = target is not None and (s := snaps.get(target)) is not None and s.status == "ready"

    blocked: Cond | None = None
    if target is None:
        blocked = (True, "SourceNotFound", f"spec.from {src!r} names no ForkParent or ForkLayer"
                                           + (" it can be built from" if src in layers else ""))
    elif net_mismatch is not None:
        blocked = (True, "NetworkMismatch", net_mismatch)
    fail = failures.get(key)
    oom = sorted(c.id for c in kids.dead if c.status == "oom-killed")
    deg = blocked or ((True, "SpawnFailed", _failed("spawn", fail, None, now)) if fail is not None else
                      (True, "ChildOOMKilled", f"{len(oom)} child(ren) went past child.memoryLimitMiB and were "
                                               f"OOM-killed: {', '.join(oom[:5])}") if oom else OK)

    if blocked is not None:
        rec: Cond = (False, blocked[1], blocked[2])
    elif not target_ready:
        rec = (True, "WaitingForSnapshot", f"waiting for snapshot {target} of ForkParent {src}")
    elif kids.idle_old:
        rec = (True, "RollingOut", f"replacing {len(kids.idle_old)} idle children from older snapshots with {target}")
    elif len(kids.idle_current) != warm or n_current != len(kids.idle_current):
        rec = (True, "Scaling", f"{n_current} of {warm} warm children ready")
    else:
        rec = (False, "WarmPoolReady", "")
    if blocked is not None:
        r: Cond = (False, blocked[1], blocked[2])
    elif target_ready and n_current >= warm:
        r = (True, "WarmPoolReady", f"{n_current} of {warm} warm children ready on {target}")
    else:
        r = (False, rec[1], f"{n_current} of {warm} warm children ready")
    target_snap = snaps.get(target) if target else None
    last = None
    if target_snap is not None and target_snap.compacted_from:
        last = f"{rfc3339(target_snap.created_at)}: compacted {target_snap.compacted_from} into {target} " \
               f"({target_snap.compaction_reason or 'no reason recorded'})"
    return ForkPoolStatus(observedGeneration=pool.metadata.generation, warm=n_warm, claimed=len(kids.claimed),
                          target=warm, snapshot=target, chainDepth=chain_depth(target, snaps) if target else 0,
                          lastCompaction=last, conditions=_conditions(key, r, rec, deg, previous, stamp))


def branch_status(b: ForkBranch, tag: str, snaps: dict[str, SnapshotState], failures: dict[str, Failure],
                  actual: Actual, previous: dict[str, Status | None], stamp: str) -> ForkBranchStatus:
    key, now = f"ForkBranch/{b.metadata.name}", actual.now
    snap, fail = snaps.get(tag), failures.get(key)
    src = branch_source(b, actual.children)
    if snap is not None and snap.status == "ready":
        r: Cond = (True, "SnapshotReady", f"branch snapshot {tag} is ready")
        rec, deg = (False, "SnapshotReady", ""), OK
    elif snap is not None and snap.status == "writing":
        r = (False, "Branching", f"writing {tag}")
        rec, deg = (True, "Branching", f"writing {tag}"), OK
    elif src is None:
        msg = f"no running sandbox {b.spec.sandbox!r} to branch"
        r, rec, deg = (False, "SandboxNotFound", msg), (False, "SandboxNotFound", msg), (True, "SandboxNotFound", msg)
    else:
        broken = fail is not None or (snap is not None and snap.status == "failed")
        msg = _failed("branch", fail, snap.error if snap else None, now) if broken else ""
        r = (False, "BranchFailed", msg) if broken else (False, "Branching", f"branching {src.id}")
        rec = (True, "Branching", f"branching {src.id} ({b.spec.mode})")
        deg = (True, "BranchFailed", msg) if broken else OK
    return ForkBranchStatus(observedGeneration=b.metadata.generation,
                            snapshot=tag if snap is not None and snap.status == "ready" else None,
                            conditions=_conditions(key, r, rec, deg, previous, stamp))


def compute_status(desired: Desired, actual: Actual, previous: dict[str, Status | None]) -> dict[str, Status]:
    snaps, failures = snapshots_by_tag(actual), failures_by_key(actual)
    parents = unique_by_name(desired.parents)
    parent_names = {p.metadata.name for p in parents}
    branches = [b for b in unique_by_name(desired.branches) if b.metadata.name not in parent_names]
    taken = parent_names | {b.metadata.name for b in branches}
    layer_objs = [la for la in unique_by_name(desired.layers) if la.metadata.name not in taken]
    tags = resolve_tags(parents, layer_objs, branches)
    layers = {la.metadata.name for la in layer_objs}
    by_pool = children_by_pool(actual)
    stamp = rfc3339(actual.now)
    out: dict[str, Status] = {}
    for p in parents:
        name = p.metadata.name
        out[f"ForkParent/{name}"] = parent_status(p, tags[name], snaps, failures, actual, previous, stamp)
    for la in layer_objs:
        out[f"ForkLayer/{la.metadata.name}"] = layer_status(la, tags, snaps, failures, actual, previous, stamp)
    for pool in unique_by_name(desired.pools):
        out[f"ForkPool/{pool.metadata.name}"] = pool_status(pool, tags, layers, snaps, failures,
                                                            by_pool.get(pool.metadata.name, []), actual, previous,
                                                            stamp, network_mismatch(pool, parents, layer_objs))
    for b in branches:
        out[f"ForkBranch/{b.metadata.name}"] = branch_status(b, tags[b.metadata.name], snaps, failures, actual,
                                                             previous, stamp)
    return out
