"""What each action does through the core: one small handler per action type, dispatched by the HANDLERS table.

A handler reads the object it acts for, has it build the core's typed request, calls the core and returns the
message recorded as the object's event ("" records none). A request the spec object refuses to build is a
TerminalError (the same spec would be refused again); any other failure is retried with back-off.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from forkd.base import clock
from forkd.base.errors import InvalidInput, TerminalError
from forkd.core.requests import Compaction
from forkd.reconciler import observe
from forkd.reconciler.actions import (
    BuildBranch,
    BuildLayer,
    BuildParent,
    ClaimChildren,
    CompactSnapshot,
    DeleteSnapshot,
    ForgetClaim,
    RetireChild,
    SpawnChildren,
)
from forkd.reconciler.objects import ObjectStore
from forkd.reconciler.poollocks import pool_lock
from forkd.reconciler.state import ClaimRecord
from forkd.reconciler.world import GONE, pool_room
from forkd.spec.models import ImageRef
from forkd.spec.namespaces import qualify

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime
    from forkd.sandbox.child import ChildRecord

R = TypeVar("R")
SPAWN_SAMPLES = 50  # spawn-to-answer times kept per pool for its p50


@dataclass(frozen=True)
class Context:
    """What handlers act on: the runtime, the applied objects, and the spawn times pools' p50s come from."""

    rt: Runtime
    objects: ObjectStore
    spawn_ms: dict[str, deque[float]]
    claim: Callable[[str, int], list[Any]]  # the pool's claim path: Control.claim(pool, n)


def _request(make: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """The request a spec object builds; one it refuses is refused again until the spec changes: TerminalError."""
    try:
        return make(*args, **kwargs)
    except InvalidInput as exc:
        raise TerminalError(exc.message, hint=exc.hint) from exc


def _image_id(rt: Runtime, image: ImageRef, memory_mib: int) -> str | None:
    """The image a parent boots, built once and cached by content (None: the default image, {builtin: python})."""
    from forkd.core import images

    if image.oci is not None:
        built, _ = images.build_oci(rt, image.oci.ref, memory_mib=memory_mib, rootfs=image.oci.rootfs or "auto")
        return built.id
    if image.debian is not None:
        deb = image.debian
        built, _ = images.build_debian(rt, deb.all_packages(), deb.suite, memory_mib=memory_mib,
                                       rootfs=deb.rootfs or "auto")
        return built.id
    return None


def build_parent(ctx: Context, a: BuildParent) -> str:
    parent = ctx.objects.get("ForkParent", a.parent).obj
    image_id = _image_id(ctx.rt, parent.spec.image, parent.spec.memoryMiB)
    labels = {observe.PARENT_LABEL: a.parent, observe.SPEC_HASH_LABEL: a.spec_hash}
    ctx.rt.create_snapshot(_request(parent.to_request, a.tag, image_id, labels))
    return f"built snapshot {a.tag}"


def build_layer(ctx: Context, a: BuildLayer) -> str:
    layer = ctx.objects.get("ForkLayer", a.layer).obj
    ctx.rt.snapshot_diff(_request(layer.to_request, a.tag, a.from_tag, {observe.LAYER_LABEL: a.layer}))
    return f"built layer {a.tag} on {a.from_tag}"


def build_branch(ctx: Context, a: BuildBranch) -> str:
    b = ctx.objects.get("ForkBranch", a.branch).obj
    res = ctx.rt.branch(_request(b.to_request, a.child, a.tag, {observe.BRANCH_LABEL: a.branch}))
    pause = f", source paused {res.pause_ms:.0f} ms" if res.pause_ms is not None else ""
    return f"branched {a.child} into {a.tag} ({a.mode}{pause})"


def compact(ctx: Context, a: CompactSnapshot) -> str:
    labels = {observe.POOL_LABEL: a.pool, observe.COMPACTION_REASON_LABEL: a.reason}
    ctx.rt.compact(_request(Compaction.of, from_tag=a.from_tag, to_tag=a.tag, labels=labels))
    return f"compacted {a.from_tag} into {a.tag} ({a.reason})"


def spawn(ctx: Context, a: SpawnChildren) -> str:
    """Fork what plan() asked for, as far as maxChildren still has room now: under the pool's lock, so a claim
    forking on the spot meanwhile is counted (forkd.reconciler.poollocks)."""
    pool = qualify(ctx.objects.get("ForkPool", a.pool).obj)  # its children's pool: the qualified name
    with pool_lock(pool.metadata.name):
        room = pool_room(observe.child_states(ctx.rt, pool.metadata.name), pool.spec.maxChildren, clock.wall())
        if min(a.count, room) <= 0:
            return ""
        recs = ctx.rt.fork(_request(pool.to_request, a.tag, min(a.count, room)))
    samples = ctx.spawn_ms.setdefault(a.pool, deque(maxlen=SPAWN_SAMPLES))
    samples.extend(r.timings_ms.get("ready", 0.0) for r in recs)
    return f"spawned {len(recs)} children of {a.tag}"


def still_retirable(rec: ChildRecord, reason: str, now: float, boot: float) -> bool:
    """Does the child, as its record is now, still qualify for the retirement plan() decided on an older view?
    A dead one stays dead; an expired claim stays expired (by its CLOCK_BOOTTIME end: `boot` is that clock at
    `now`); an idle one (scale-down, rollout, orphaned) must not have been claimed since."""
    if reason in ("dead", "oom-killed"):
        return rec.status in GONE
    if reason == "expired":
        return rec.claimed and clock.ended(rec.expires_at, rec.expires_boot, now, boot)
    return not rec.claimed


def retire(ctx: Context, a: RetireChild) -> str:
    """Retire the child if it still qualifies (checked and marked under the registry lock, see Runtime.retire):
    never a child claimed meanwhile, nor one another operation is creating or stopping; otherwise no event."""
    if not ctx.rt.retire(a.child, lambda rec: still_retirable(rec, a.reason, clock.wall(), clock.elapsed())):
        return ""
    return f"retired child {a.child} ({a.reason})"


def delete_snapshot(ctx: Context, a: DeleteSnapshot) -> str:
    ctx.rt.rmi(a.tag)
    return ""


def claim(ctx: Context, a: ClaimChildren) -> str:
    """Claim through the pool's claim path (warm children first, forked on the spot when too few), or fork from the
    `from` branch's snapshot (children of no pool: only their claim retires them); then record what the claim holds
    and when it ends."""
    obj = ctx.objects.get("ForkClaim", a.claim).obj
    if a.from_tag is None:
        recs = ctx.claim(a.pool, a.count)
    else:
        pool = qualify(ctx.objects.get("ForkPool", a.pool).obj)
        recs = ctx.rt.fork(_request(pool.to_request, a.from_tag, a.count).model_copy(update={"pool": None}))
    now = clock.wall()
    ends, ends_boot = clock.until(a.shutdown_at) if a.shutdown_at is not None else clock.deadline(a.ttl)
    recs = ctx.rt.handles.mark_claimed([r.id for r in recs], now, ends, ends_boot)
    ctx.objects.put_claim(ClaimRecord(a.claim, tuple(r.id for r in recs), now, ends,
                                      obj.metadata.creationTimestamp or "", ends_boot))
    return f"claimed {', '.join(r.id for r in recs)} from {a.from_tag or 'pool ' + a.pool}"


def forget_claim(ctx: Context, a: ForgetClaim) -> str:
    ctx.objects.forget_claim(a.claim)
    return ""


@dataclass(frozen=True)
class Handler:
    run: Callable[[Context, Any], str]
    slow: bool  # slow ones run on a worker thread, tracked as in flight; quick ones inline


HANDLERS: dict[type, Handler] = {
    BuildParent: Handler(build_parent, slow=True),
    BuildLayer: Handler(build_layer, slow=True),
    BuildBranch: Handler(build_branch, slow=True),
    CompactSnapshot: Handler(compact, slow=True),
    SpawnChildren: Handler(spawn, slow=True),
    RetireChild: Handler(retire, slow=False),
    DeleteSnapshot: Handler(delete_snapshot, slow=False),
    ClaimChildren: Handler(claim, slow=True),
    ForgetClaim: Handler(forget_claim, slow=False),
}
