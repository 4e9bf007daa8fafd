"""What the reconciler sees of the world: plain frozen values, read from disk by `observe` (executor side)
and handed to the pure `plan`. Nothing here does I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from forkd.reconciler.actions import Action
from forkd.spec.models import ForkBranch, ForkClaim, ForkLayer, ForkParent, ForkPool


@dataclass(frozen=True)
class SnapshotState:
    tag: str
    status: str  # writing | ready | failed
    owner: str | None = None  # the object that built it, "ForkParent/x" style (None: by hand, never collected)
    spec_hash: str | None = None  # the owner's spec hash it was built from
    error: str | None = None
    created_at: float = 0.0
    parent_tag: str | None = None  # layers: the snapshot it is a diff against
    compacted_from: str | None = None  # compacted bases: the chain head they were written from
    compaction_reason: str | None = None
    pulled_at: float | None = None  # owned pulls (forkd.core.pack.oci): when it was installed, for the grace window


@dataclass(frozen=True)
class ChildState:
    id: str
    snapshot: str
    pool: str | None  # owning pool (None: forked by hand, never touched by the reconciler)
    status: str  # starting | running | dead | failed
    claimed: bool = False
    claimed_at: float | None = None
    expires_at: float | None = None  # claimed children: when their ttl ends, on the time of day as observed
    created_at: float = 0.0
    agent_socket: str | None = None  # how to reach it on this node (a ForkClaim's status lists it)


@dataclass(frozen=True)
class ClaimRecord:
    """What a ForkClaim holds, as recorded when its children were claimed (forkd.reconciler.objects): kept after
    the claim is deleted, until its children are retired, so a deleted claim's children are found and killed."""

    name: str
    children: tuple[str, ...]
    claimed_at: float
    expires_at: float | None = None
    uid: str = ""  # the claim's metadata.creationTimestamp: a claim deleted and made again is another claim
    expires_boot: float | None = None  # the same end on CLOCK_BOOTTIME (forkd.base.clock): what is compared


@dataclass(frozen=True)
class Failure:
    """A recent failure of an action on an object: retried not before `retry_at`; a `terminal` one (a TerminalError)
    is not retried at all while plan asks for the same `action` (a changed spec asks for another)."""

    kind: str
    name: str
    message: str
    attempts: int
    retry_at: float
    terminal: bool = False
    action: Action | None = None


@dataclass(frozen=True)
class Desired:
    parents: tuple[ForkParent, ...] = ()
    layers: tuple[ForkLayer, ...] = ()
    pools: tuple[ForkPool, ...] = ()
    branches: tuple[ForkBranch, ...] = ()
    claims: tuple[ForkClaim, ...] = ()


@dataclass(frozen=True)
class Actual:
    snapshots: tuple[SnapshotState, ...] = ()
    children: tuple[ChildState, ...] = ()
    failures: tuple[Failure, ...] = ()
    now: float = 0.0
    in_flight: frozenset[str] = field(default_factory=frozenset)  # keys of actions still running
    spawn_p50_ms: tuple[tuple[str, float], ...] = ()  # (pool, p50 of recent spawn-to-answer times)
    claims: tuple[ClaimRecord, ...] = ()  # what each ForkClaim (deleted ones too) holds
    pull_grace: float = 60.0  # FORKD_PULL_GRACE's default (observe.actual passes the setting; a test keeps them equal)
