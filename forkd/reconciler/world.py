"""The resolved view of one reconcile pass: the desired objects against the actual state, every rule applied once.

`resolve(desired, actual) -> World` is pure (time is `actual.now`; inputs are sorted first). plan(), the statuses
and a pool's claim target all read one World, so they cannot disagree on which objects count (one per kind and
name, the smallest spec hash winning; a name a ForkParent holds is not a ForkBranch's, and neither is a
ForkLayer's), which snapshot tag each stands for, what a pool spawns from, or what waits for a change of spec.
Names here are qualified by namespace ("ns.name" outside "default", forkd.spec.namespaces): `resolve` qualifies the
desired objects first, so every tag, pool and claim record it plans for is namespace-qualified. An object whose
spec names something outside its namespace is refused (stuck, ForeignReference) and planned for no further; a
branch's raw child id resolves only against the children of its own namespace (`child_namespaces`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from forkd.base.errors import InvalidInput
from forkd.reconciler.actions import Action
from forkd.reconciler.state import Actual, ChildState, ClaimRecord, Desired, Failure, SnapshotState
from forkd.spec.models import (
    ForkBranch,
    ForkClaim,
    ForkLayer,
    ForkObject,
    ForkParent,
    ForkPool,
    duration_seconds,
    rfc3339_seconds,
    spec_hash,
)
from forkd.spec.namespaces import DEFAULT, POOL_PREFIX, qname, qualify, split_qname

LIVE = ("starting", "running")  # children that count; dead / failed ones are retired and replaced
GONE = ("dead", "failed", "oom-killed")


# -- snapshot tags ------------------------------------------------------------------------------------------
def tag_stem(name: str) -> str:
    """The start of the tags an object makes: its (qualified) name, which fits when it has at most 52 characters
    (every name of the namespace "default"); a longer "namespace.name" is cut to 35, then '_' and a hash of it.
    No name or namespace holds '_': a cut stem is no name another namespace can take."""
    return name if len(name) <= 52 else f"{name[:35]}_{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def parent_tag(parent: ForkParent) -> str:
    """The snapshot tag of a parent's current spec: "<stem>-<10 hex digits>" (at most 63 characters)."""
    return f"{tag_stem(parent.metadata.name)}-{spec_hash(parent)[:10]}"


def layer_tag(layer: ForkLayer, from_tag: str) -> str:
    """A layer's snapshot tag: changes with its spec and with the snapshot it is built on."""
    digest = hashlib.sha256(f"{spec_hash(layer)}:{from_tag}".encode()).hexdigest()[:10]
    return f"{tag_stem(layer.metadata.name)}-{digest}"


def compact_tag(head: str) -> str:
    """The tag of the base snapshot a chain head is compacted into."""
    return "cmp-" + hashlib.sha256(head.encode()).hexdigest()[:16]


def branch_tag(b: ForkBranch) -> str:
    return f"{tag_stem(b.metadata.name)}-{spec_hash(b)[:10]}"


def resolve_tags(parents: Sequence[ForkParent], layers: Sequence[ForkLayer],
                 branches: Sequence[ForkBranch] = ()) -> dict[str, str]:
    """Object name -> the snapshot tag it stands for (parents and branches first; layers once their `from`
    resolves; a cycle or an unknown `from` leaves a layer out)."""
    tags = {b.metadata.name: branch_tag(b) for b in branches}
    tags.update({p.metadata.name: parent_tag(p) for p in parents})
    changed = True
    while changed:
        changed = False
        for la in layers:
            n = la.metadata.name
            if n not in tags and la.spec.from_ in tags:
                tags[n] = layer_tag(la, tags[la.spec.from_])
                changed = True
    return tags


def chain_depth(tag: str, snaps: Mapping[str, SnapshotState]) -> int:
    depth, seen = 0, {tag}
    while (s := snaps.get(tag)) is not None and s.parent_tag and s.parent_tag not in seen and depth < 256:
        tag = s.parent_tag
        seen.add(tag)
        depth += 1
    return depth


# -- the rules ----------------------------------------------------------------------------------------------
def unique_by_name(objs: Iterable) -> list:
    """Objects sorted by name, one per name (duplicates: the smallest spec hash wins, whatever the input order)."""
    best: dict[str, object] = {}
    for o in objs:
        n = o.metadata.name
        if n not in best or spec_hash(o) < spec_hash(best[n]):
            best[n] = o
    return [best[n] for n in sorted(best)]


def child_namespaces(children: Sequence[ChildState], snaps: Mapping[str, SnapshotState],
                     records: Sequence[ClaimRecord]) -> dict[str, str]:
    """Child id -> the namespace it belongs to: its pool's; else that of the claim whose record holds it; else
    that of the object that made its snapshot (a claim's child forked from a branch, before its record is written);
    else "default" (forked by hand: the CLI's and the API's)."""
    held = {cid: r.name for r in records for cid in r.children}
    out = {}
    for c in children:
        owner = (s.owner or "").partition("/")[2] if (s := snaps.get(c.snapshot)) is not None else ""
        owner_name = c.pool or held.get(c.id) or owner
        out[c.id] = split_qname(owner_name)[0] if owner_name else DEFAULT
    return out


def branch_source(b: ForkBranch, children: Sequence[ChildState], namespaces: Mapping[str, str]) -> ChildState | None:
    """The running child of the branch's namespace it snapshots (`namespaces`: child_namespaces): by id, or the
    oldest claimed child of `pool/<name>`."""
    ns, want = split_qname(b.metadata.name)[0], b.spec.sandbox
    mine = [c for c in children if c.status == "running" and namespaces.get(c.id) == ns]
    if want.startswith(POOL_PREFIX):
        pool = want.removeprefix(POOL_PREFIX)
        cands = [c for c in mine if c.pool == pool and c.claimed]
        return min(cands, key=lambda c: (c.created_at, c.id)) if cands else None
    return next((c for c in mine if c.id == want), None)


def pool_target(pool: ForkPool, tags: Mapping[str, str], snaps: Mapping[str, SnapshotState]) -> str | None:
    """The snapshot tag a pool spawns from: its source's current tag, or the compacted base of that chain head
    once it is ready (None: the source is unknown)."""
    head = tags.get(pool.spec.from_)
    if head is not None:
        compacted = snaps.get(compact_tag(head))
        if compacted is not None and compacted.status == "ready":
            return compacted.tag
    return head


def source_networks(parents: Sequence[ForkParent], layers: Sequence[ForkLayer]) -> dict[str, str]:
    """Object name -> the network mode of the ForkParent it descends from (through layers); a name missing: unknown
    (a branch, a cycle, or nothing)."""
    nets = {p.metadata.name: p.spec.network for p in parents}
    changed = True
    while changed:
        changed = False
        for la in layers:
            if la.metadata.name not in nets and la.spec.from_ in nets:
                nets[la.metadata.name] = nets[la.spec.from_]
                changed = True
    return nets


def network_mismatch(pool: ForkPool, nets: Mapping[str, str]) -> str | None:
    """Why the pool's child.network cannot work with its parent (None: it can). Children restore the parent's
    device set: an isolated pool needs a parent with a NIC, and a parent with a NIC only has isolated children."""
    net = nets.get(pool.spec.from_)
    if net is None or net == pool.spec.child.network:
        return None
    return (f"child.network is {pool.spec.child.network} but its ForkParent has spec.network: {net}; "
            f"set both to the same value")


@dataclass(frozen=True)
class PoolChildren:
    """A pool's children sorted into what the rules treat differently."""

    dead: list[ChildState]  # dead / failed: retired, no longer count
    expired: list[ChildState]  # claimed with an ended ttl: retired
    claimed: list[ChildState]  # claimed, live: never touched
    idle_current: list[ChildState]  # unclaimed, starting/running, on the target tag
    idle_old: list[ChildState]  # unclaimed, starting/running, on any other tag
    other: list[ChildState]  # unclaimed in a status we do not know: left alone, but counted

    @property
    def live(self) -> int:
        return len(self.claimed) + len(self.idle_current) + len(self.idle_old) + len(self.other)


def pool_room(children: Sequence[ChildState], cap: int, now: float) -> int:
    """How many more children a pool whose maxChildren is `cap` may have now: its live ones count as plan_pool
    counts them (claimed, idle, starting; not the dead, nor claimed ones whose ttl ended)."""
    return max(0, cap - split_children(children, None, now).live)


def split_children(children: Sequence[ChildState], target: str | None, now: float) -> PoolChildren:
    p = PoolChildren([], [], [], [], [], [])
    for c in children:
        if c.status in GONE:
            p.dead.append(c)
        elif c.claimed:
            (p.expired if c.expires_at is not None and c.expires_at <= now else p.claimed).append(c)
        elif c.status not in LIVE:
            p.other.append(c)
        else:
            (p.idle_current if target is not None and c.snapshot == target else p.idle_old).append(c)
    return p


def claim_uid(c: ForkClaim) -> str:
    """What tells one ForkClaim from a claim of the same name deleted and applied again."""
    return c.metadata.creationTimestamp or ""


def claim_shutdown(c: ForkClaim) -> float | None:
    """The fixed time a claim's children are released (spec.shutdownTime), or None."""
    return rfc3339_seconds(c.spec.shutdownTime) if c.spec.shutdownTime else None


def claim_ttl(c: ForkClaim, pool: ForkPool | None) -> float | None:
    """How long after claiming the children are released: spec.ttl, else the pool's child.ttlSeconds (as for
    `forkd claim`), else None (until the claim is deleted); None too when spec.shutdownTime says when."""
    if c.spec.shutdownTime:
        return None
    if c.spec.ttl:
        return duration_seconds(c.spec.ttl)
    ttl = pool.spec.child.ttlSeconds if pool is not None else None
    return float(ttl) if ttl else None


@dataclass(frozen=True)
class Stuck:
    """Why an object cannot make progress until its spec, or the objects it names, change."""

    reason: str  # CamelCase, the Degraded condition's reason
    message: str


# -- the view -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class World:
    """One pass's resolved view (see the module docstring); build it with `resolve`."""

    now: float
    parents: tuple[ForkParent, ...]  # one per name, sorted by name (as every object tuple here)
    branches: tuple[ForkBranch, ...]  # names no parent holds
    layers: tuple[ForkLayer, ...]  # names no parent or branch holds (resolvable or not)
    pools: tuple[ForkPool, ...]
    tags: Mapping[str, str]  # object name -> the snapshot tag it stands for
    snaps: Mapping[str, SnapshotState]  # by tag
    children: tuple[ChildState, ...]  # every child, the hand-forked ones too
    kids: Mapping[str, PoolChildren]  # desired pool -> its children, split against its target
    orphans: Mapping[str, list[ChildState]]  # pool no longer desired -> its children (by id)
    targets: Mapping[str, str | None]  # pool -> the tag it spawns from (None: its source is unknown)
    mismatches: Mapping[str, str]  # pool -> why its child.network cannot work with its parent
    sources: Mapping[str, ChildState]  # branch -> the running child it snapshots
    stuck: Mapping[str, Stuck]  # "Kind/name" -> why it waits for a change of spec
    failures: Mapping[str, Failure]  # action key -> its latest failure
    in_flight: frozenset[str]  # keys of actions still running
    p50s: Mapping[str, float]  # pool -> p50 of recent spawn-to-answer times (ms)
    pull_grace: float  # seconds an owned pull's snapshot is kept before its object is applied (Actual's)
    claims: tuple[ForkClaim, ...] = ()
    records: Mapping[str, ClaimRecord] = field(default_factory=dict)  # claim name -> what it holds
    stray_records: tuple[ClaimRecord, ...] = ()  # records of claims deleted (or deleted and made again)
    refused: tuple[ForkObject, ...] = ()  # objects naming something outside their namespace (stuck: why)

    def child(self, child_id: str) -> ChildState | None:
        return next((c for c in self.children if c.id == child_id), None)

    def pool(self, name: str) -> ForkPool | None:
        return next((p for p in self.pools if p.metadata.name == name), None)

    def stalled(self, key: str) -> bool:
        """Cannot progress until its spec (or what it names) changes: kstatus' and Flux's Stalled."""
        kind, _, name = key.partition("/")
        return key in self.terminal or (kind == "ForkPool" and name in self.mismatches)

    def ready(self, tag: str | None) -> bool:
        return tag is not None and (s := self.snaps.get(tag)) is not None and s.status == "ready"

    def waiting(self, key: str) -> bool:
        """The action on `key` is running, or backing off after a failure (a retryable one)."""
        f = self.failures.get(key)
        return key in self.in_flight or (f is not None and not f.terminal and self.now < f.retry_at)

    def blocked(self, action: Action) -> bool:
        """Not to be started now: waiting, or the very action already failed for good (a TerminalError)."""
        f = self.failures.get(action.key)
        return self.waiting(action.key) or (f is not None and f.terminal and f.action == action)

    @property
    def terminal(self) -> frozenset[str]:
        """Objects ("Kind/name") that cannot progress until something changes: stuck by a rule, or failed with a
        TerminalError (and not being retried with another action right now)."""
        failed = {k for k, f in self.failures.items() if f.terminal and k not in self.in_flight}
        return frozenset(self.stuck) | failed


def qualified(desired: Desired) -> tuple[Desired, dict[str, tuple[ForkObject, Stuck]]]:
    """`desired` with every object's name, and the references in its spec, qualified by its namespace
    (forkd.spec.namespaces): the World and plan() see "ns.name" outside the namespace "default". Apart, by
    "Kind/name": the objects refused for naming something outside their namespace (their name qualified, their
    spec as written), and why."""
    kept: list[tuple] = []
    refused: dict[str, tuple[ForkObject, Stuck]] = {}
    for objs in (desired.parents, desired.layers, desired.pools, desired.branches, desired.claims):
        ok = []
        for o in objs:
            try:
                ok.append(qualify(o))
            except InvalidInput as exc:
                name = qname(o.metadata.namespace, o.metadata.name)
                key = f"{o.kind}/{name}"
                if key not in refused or spec_hash(o) < spec_hash(refused[key][0]):  # as unique_by_name
                    named = o.model_copy(update={"metadata": o.metadata.model_copy(update={"name": name})})
                    refused[key] = (named, Stuck("ForeignReference", f"{exc.message} ({exc.hint})"))
        kept.append(tuple(ok))
    return Desired(*kept), dict(sorted(refused.items()))


def resolve(desired: Desired, actual: Actual) -> World:
    desired, refused = qualified(desired)
    parents = unique_by_name(desired.parents)
    taken = {p.metadata.name for p in parents}
    branches = [b for b in unique_by_name(desired.branches) if b.metadata.name not in taken]
    taken |= {b.metadata.name for b in branches}
    layers = [la for la in unique_by_name(desired.layers) if la.metadata.name not in taken]
    pools = unique_by_name(desired.pools)
    tags = resolve_tags(parents, layers, branches)
    snaps = {s.tag: s for s in sorted(actual.snapshots, key=lambda s: (s.tag, s.status, s.created_at))}
    by_pool: dict[str, list[ChildState]] = {}
    for c in sorted(actual.children, key=lambda c: c.id):
        if c.pool is not None:
            by_pool.setdefault(c.pool, []).append(c)
    targets = {p.metadata.name: pool_target(p, tags, snaps) for p in pools}
    owners = child_namespaces(actual.children, snaps, actual.claims)
    sources = {b.metadata.name: s for b in branches if (s := branch_source(b, actual.children, owners)) is not None}
    nets = source_networks(parents, layers)
    stuck = _stuck(layers, pools, branches, tags, snaps, sources) | {k: why for k, (_, why) in refused.items()}
    return World(
        now=actual.now, parents=tuple(parents), branches=tuple(branches), layers=tuple(layers), pools=tuple(pools),
        tags=tags, snaps=snaps, children=actual.children,
        kids={n: split_children(by_pool.get(n, []), t, actual.now) for n, t in targets.items()},
        orphans={n: cs for n, cs in sorted(by_pool.items()) if n not in targets}, targets=targets,
        mismatches={p.metadata.name: m for p in pools if (m := network_mismatch(p, nets)) is not None},
        sources=sources, stuck=stuck,
        failures={f"{f.kind}/{f.name}": f for f in sorted(actual.failures, key=lambda f: (f.retry_at, f.attempts,
                                                                                         f.message))},
        in_flight=actual.in_flight, p50s=dict(actual.spawn_p50_ms), refused=tuple(o for o, _ in refused.values()),
        pull_grace=actual.pull_grace,
        **_claims(desired, actual, pools, branches, stuck))


def _claims(desired: Desired, actual: Actual, pools: Sequence[ForkPool], branches: Sequence[ForkBranch],
            stuck: dict[str, Stuck]) -> dict:
    """The World's claim fields; adds to `stuck` the claims whose pool or `from` branch does not exist."""
    claims = unique_by_name(desired.claims)
    uids = {c.metadata.name: claim_uid(c) for c in claims}
    recs = sorted(actual.claims, key=lambda r: (r.name, r.uid))
    pool_names, branch_names = {p.metadata.name for p in pools}, {b.metadata.name for b in branches}
    for c in claims:
        key = f"ForkClaim/{c.metadata.name}"
        if c.spec.pool not in pool_names:
            stuck[key] = Stuck("PoolNotFound", f"spec.pool {c.spec.pool!r} names no ForkPool")
        elif c.spec.from_ is not None and c.spec.from_ not in branch_names:
            stuck[key] = Stuck("BranchNotFound", f"spec.from {c.spec.from_!r} names no ForkBranch")
    return {"claims": tuple(claims), "records": {r.name: r for r in recs if uids.get(r.name) == r.uid},
            "stray_records": tuple(r for r in recs if uids.get(r.name) != r.uid)}


def _stuck(layers: Sequence[ForkLayer], pools: Sequence[ForkPool], branches: Sequence[ForkBranch],
           tags: Mapping[str, str], snaps: Mapping[str, SnapshotState],
           sources: Mapping[str, ChildState]) -> dict[str, Stuck]:
    """What waits for a change of spec: a layer or pool whose `from` names nothing it can be built from, a branch
    with no running sandbox to snapshot (and no snapshot yet)."""
    out: dict[str, Stuck] = {}
    layer_names = {la.metadata.name for la in layers}
    for la in layers:
        if la.metadata.name not in tags:
            out[f"ForkLayer/{la.metadata.name}"] = Stuck("SourceNotFound", f"spec.from {la.spec.from_!r} names no "
                                                         f"ForkParent or ForkLayer (or the layers form a cycle)")
    for p in pools:
        if p.spec.from_ not in tags:
            what = " it can be built from" if p.spec.from_ in layer_names else ""
            out[f"ForkPool/{p.metadata.name}"] = Stuck("SourceNotFound", f"spec.from {p.spec.from_!r} names no "
                                                       f"ForkParent or ForkLayer{what}")
    for b in branches:
        snap = snaps.get(tags[b.metadata.name])
        if (snap is None or snap.status == "failed") and b.metadata.name not in sources:
            out[f"ForkBranch/{b.metadata.name}"] = Stuck("SandboxNotFound", _no_sandbox(b))
    return out


def _no_sandbox(b: ForkBranch) -> str:
    ns, sandbox = split_qname(b.metadata.name)[0], b.spec.sandbox
    if sandbox.startswith(POOL_PREFIX):  # as written: pool/<name>, not the qualified pool
        sandbox = POOL_PREFIX + split_qname(sandbox.removeprefix(POOL_PREFIX))[1]
        what = "its ForkPool has no running claimed child"
    else:
        what = "no running child of this id"
    return (f"spec.sandbox {sandbox!r}: {what} in namespace {ns} (children of other namespaces are never "
            f"branched); name a running child of namespace {ns} by id, or pool/<name> of one of its ForkPools")
