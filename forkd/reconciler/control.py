"""Operations on declarative objects that every front end shares: apply, diff, get, describe, delete, claim.

Front ends (CLI, daemon API) call these and print; a daemon calls them in-process, the CLI calls them through
the daemon when one runs (see forkd.client).
"""

from __future__ import annotations

import difflib
import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from forkd.base import clock
from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound
from forkd.base.names import check_tag
from forkd.base.settings import settings
from forkd.base.telemetry import observe as observe_event
from forkd.reconciler import observe
from forkd.reconciler.engine import Reconciler
from forkd.reconciler.objects import APPLYSET, MANAGED_BY, ObjectStore, key
from forkd.reconciler.poollocks import pool_lock
from forkd.reconciler.state import Actual
from forkd.reconciler.world import parent_tag, pool_room, resolve
from forkd.sandbox.child import Claim
from forkd.spec.models import ForkObject, to_document
from forkd.spec.namespaces import DEFAULT, check_references, qualify
from forkd.spec.refs import parse_ref, resolve_kind  # noqa: F401 - named here too (forkd.api, forkd.client)

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime
    from forkd.sandbox.child import ChildRecord


@dataclass(frozen=True)
class Change:
    kind: str
    name: str
    change: str  # created | configured | unchanged | pruned
    generation: int
    namespace: str = DEFAULT


def applyset_id(sources: list[str]) -> str:
    """Default apply set: derived from the files applied together (like kubectl's --applyset)."""
    return "files-" + hashlib.sha256("\n".join(sorted(sources)).encode()).hexdigest()[:12]


def managed_by(obj: ForkObject) -> str:
    """Who applies `obj`: its forkd.dev/managed-by annotation ("cli" for objects stored before there was one)."""
    return obj.metadata.annotations.get(MANAGED_BY, "cli")


class Control:
    def __init__(self, rt: Runtime, reconciler: Reconciler | None = None):
        self.rt = rt
        self.objects = ObjectStore(rt.layout)
        self._reconciler = reconciler
        self._target_cache: dict[str, Any] = {}

    @property
    def reconciler(self) -> Reconciler:
        if self._reconciler is None:
            self._reconciler = Reconciler(self.rt, self.objects)
        return self._reconciler

    # -- apply / diff / delete ---------------------------------------------------------------------
    def apply(self, objs: list[tuple[ForkObject, str]], applyset: str, prune: bool = False,
              dry_run: bool = False, manager: str = "cli", force: bool = False) -> list[Change]:
        """Store every object (all were validated before: any invalid document means nothing is applied).

        An object whose spec names something outside its namespace is refused (InvalidInput, nothing applied).
        `manager` (cli, operator, ...) is recorded as the forkd.dev/managed-by annotation; an object another
        manager applied is refused (Conflict naming its owner, nothing applied) unless `force` takes it over."""
        for obj, _ in objs:
            check_references(obj)
        out: list[Change] = []
        with self.objects.locked():
            if not force:
                for obj, _ in objs:
                    try:
                        owner = managed_by(self.objects.get(obj.kind, key(obj)).obj)
                    except NotFound:
                        continue
                    if owner != manager:
                        raise Conflict(f"{obj.kind}/{key(obj)} is managed by {owner}, not {manager}",
                                       hint=f"change it through {owner}, or delete it there first")
            for obj, source in objs:
                annotated = obj.model_copy(update={"metadata": obj.metadata.model_copy(
                    update={"annotations": {**obj.metadata.annotations, APPLYSET: applyset, MANAGED_BY: manager}})})
                if dry_run:
                    change, gen = self.objects.plan_put(annotated)
                else:
                    change, stored = self.objects.put(annotated, applyset, source)
                    gen = stored.metadata.generation
                out.append(Change(obj.kind, obj.metadata.name, change, gen, obj.metadata.namespace))
            if prune:
                keep = {(o.kind, key(o)) for o, _ in objs}
                for st in self.objects.list():
                    ref = (st.obj.kind, key(st.obj))
                    if st.applyset == applyset and ref not in keep and managed_by(st.obj) == manager:
                        if not dry_run:
                            self.objects.delete(*ref)
                        out.append(Change(st.obj.kind, st.obj.metadata.name, "pruned", st.obj.metadata.generation,
                                          st.obj.metadata.namespace))
        if not dry_run:
            self.reconciler.wake.set()
        return out

    def diff(self, objs: list[tuple[ForkObject, str]]) -> list[tuple[str, str]]:
        """(KIND/NAME, unified diff of the spec) for every object that would change."""
        out = []
        for obj, _ in objs:
            try:
                old = yaml.safe_dump(to_document(self.objects.get(obj.kind, key(obj)).obj,
                                                 with_status=False)["spec"], sort_keys=True)
            except NotFound:
                old = ""
            new = yaml.safe_dump(to_document(obj, with_status=False)["spec"], sort_keys=True)
            if old != new:
                ref = f"{obj.kind}/{key(obj)}"
                text = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                    f"{ref} (applied)", f"{ref} (file)"))
                out.append((ref, text))
        return out

    def delete(self, kind: str, name: str) -> None:
        """Delete an object; a ForkClaim's children are killed right away (the reconciler retires whatever a crash
        leaves behind, from the claim's record)."""
        with self.objects.locked():
            self.objects.delete(kind, name)
        if kind == "ForkClaim":
            self._release_claim(name)
        self.reconciler.wake.set()

    def _release_claim(self, name: str) -> None:
        here = {r.id for r in self.rt.children()}
        for rec in self.objects.claims():
            if rec.name == name:
                ids = [i for i in rec.children if i in here]
                if ids:
                    self.rt.kill(ids)
                self.objects.forget_claim(name)

    # -- reading -----------------------------------------------------------------------------------
    def get(self, kind: str, name: str | None = None) -> list[ForkObject]:
        if name:
            return [self.objects.get(kind, name).obj]
        return [st.obj for st in self.objects.list(kind)]

    def describe(self, kind: str, name: str) -> dict[str, Any]:
        st = self.objects.get(kind, name)
        out = {"object": to_document(st.obj), "source": st.source, "applyset": st.applyset,
               "events": self.objects.events(kind, name)}
        if kind == "ForkPool":
            out["children"] = [{"id": c.id, "status": c.status, "claimed": c.claimed, "snapshot": c.snapshot}
                               for c in self.rt.children() if c.pool == name]
        if kind == "ForkParent":
            out["snapshot"] = parent_tag(qualify(st.obj))
        if kind == "ForkClaim":
            held = next((r.children for r in self.objects.claims() if r.name == name), ())
            out["children"] = [{"id": c.id, "status": c.status, "claimed": c.claimed, "snapshot": c.snapshot}
                               for c in self.rt.children() if c.id in held]
        return out

    # -- claim ---------------------------------------------------------------------------------------
    def template(self, name: str) -> str:
        """The snapshot tag `name` stands for where a client names a template (E2B's word): a snapshot's own tag
        as it is; else the ready snapshot of the ForkParent, ForkLayer or ForkBranch called `name` (so
        `template="base"` forks the parent `base` in whatever version it is now); else `name`, whose spawn then
        fails naming it. Conflict when that object has no ready snapshot yet."""
        check_tag(name)
        try:
            self.rt.store.get(name)
            return name
        except NotFound:
            pass
        for kind in ("ForkParent", "ForkLayer", "ForkBranch"):
            try:
                obj = self.objects.get(kind, name).obj
            except NotFound:
                continue
            tag = getattr(obj.status, "snapshot", None) if obj.status else None
            if not tag:
                raise Conflict(f"template {name!r} is {kind} {name} and it has no ready snapshot yet",
                               hint=f"wait for it: forkd apply --wait, or forkd describe {kind} {name}")
            return tag
        return name

    def claim(self, pool: str, n: int = 1, lifetime: float | None = None) -> list[ChildRecord]:
        """`_claim`, observed: a claim's latency under its pool's qualified name, a failure counted apart (pool ""
        when the name given is no pool: a metric label only ever holds the name of a pool that exists)."""
        t0 = time.perf_counter()
        owned = ""
        try:
            owned = key(self.objects.get("ForkPool", pool).obj)
            got = self._claim(pool, n, lifetime)
        except BaseException as exc:
            observe_event("claim_failed", time.perf_counter() - t0, pool=owned,
                          reason=type(exc).__name__ if isinstance(exc, ForkdError) else "Error")
            raise
        observe_event("claim", time.perf_counter() - t0, pool=owned)
        return got

    def _claim(self, pool: str, n: int = 1, lifetime: float | None = None) -> list[ChildRecord]:
        """Hand out `n` warm children of `pool` now; the reconciler refills the pool in the background.

        Like every sandbox, claimed children have a lifetime: `lifetime` seconds, else the pool's
        child.ttlSeconds, else FORKD_SANDBOX_TIMEOUT (0: none); the reconciler retires them when it ends (a
        ForkClaim then records its own end instead).

        If fewer than `n` are warm, the rest are forked on the spot from the pool's snapshot (slower); those are
        claimed from birth, so the reconciler never sees them as idle. They count against the pool's maxChildren:
        a claim that would pass it is refused (Conflict). Forks for one pool (claims, the reconciler's refills) run one
        at a time (forkd.reconciler.poollocks): a claim that waited for a refill first takes the children it made.
        All or nothing: if the fork fails or is refused, the warm children taken are given back to the pool."""
        if not 1 <= n <= 1000:
            raise InvalidInput(f"-n {n}: use 1..1000")
        obj = qualify(self.objects.get("ForkPool", pool).obj)  # its children's pool: the qualified name
        target = self._pool_target(pool)
        ttl = lifetime or obj.spec.child.ttlSeconds or settings().sandbox_timeout or None
        got = self.rt.claim_children(pool, n, ttl, prefer_tag=target)
        if len(got) < n:
            if target is None:
                if got:
                    self.rt.unclaim([r.id for r in got])
                raise Conflict(f"pool {pool!r} has {len(got)} warm children and no ready snapshot to fork more",
                               hint=f"see 'forkd describe pool/{pool}'")
            try:
                with pool_lock(obj.metadata.name):
                    got += self.rt.claim_children(pool, n - len(got), ttl, prefer_tag=target)  # a refill's, if any
                    if len(got) < n:
                        self._check_room(obj.metadata.name, obj.spec.maxChildren, n, len(got))
                        got += self.rt.fork(obj.to_request(target, n - len(got)), claim=Claim.now(ttl))
            except BaseException:
                if got:
                    self.rt.unclaim([r.id for r in got])
                raise
        self.reconciler.wake.set()
        return got

    def _check_room(self, pool: str, cap: int, n: int, warm_taken: int) -> None:
        """Refuse forking `n - warm_taken` on the spot when the pool's maxChildren has no room for them (the
        `warm_taken` just claimed already count)."""
        room = pool_room(observe.child_states(self.rt, pool), cap, clock.wall())
        if n - warm_taken > room:
            raise Conflict(f"pool {pool!r}: a claim of {n} needs {n - warm_taken} more children than are warm, "
                           f"and its maxChildren ({cap}) leaves room for {room}",
                           hint=f"claim at most {warm_taken + room} now, wait for children to be released, or raise "
                                f"spec.maxChildren of ForkPool {pool}")

    def _pool_target(self, pool: str) -> str | None:
        """The ready snapshot the pool spawns from now, as the World of a reconcile pass has it, or None. The World
        is resolved again only when an object or snapshot directory changes: claims stay cheap."""
        kinds = [self.objects.root / k for k in ("ForkParent", "ForkLayer", "ForkPool", "ForkBranch")]
        dirs = kinds + sorted(p for k in kinds if k.is_dir() for p in k.iterdir() if p.is_dir())
        key = tuple(d.stat().st_mtime_ns if d.exists() else 0 for d in [*dirs, self.rt.store.root])
        if self._target_cache.get("key") != key:
            actual = Actual(snapshots=tuple(observe.actual_snapshots(self.rt)))
            self._target_cache = {"key": key, "targets": resolve(observe.desired(self.objects), actual).targets}
        tag = self._target_cache["targets"].get(pool)
        if tag is None:
            return None
        try:
            self.rt.store.get_ready(tag)
        except ForkdError:
            return None
        return tag
