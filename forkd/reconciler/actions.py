"""The actions `plan` returns and the executor performs. Each has a stable `key` (the object it acts on) used
for de-duplication, back-off and in-flight tracking, and an `owner`: the declarative object ("Kind", "name") whose
events tell what it did (None: no object's)."""

from __future__ import annotations

from dataclasses import dataclass

Owner = tuple[str, str] | None


@dataclass(frozen=True)
class BuildParent:
    """Boot the parent, warm it up and snapshot it as `tag` (= "<parent>-<spec hash>")."""

    parent: str
    tag: str
    spec_hash: str

    @property
    def key(self) -> str:
        return f"ForkParent/{self.parent}"

    @property
    def owner(self) -> Owner:
        return ("ForkParent", self.parent)


@dataclass(frozen=True)
class BuildLayer:
    """Fork one child of `from_tag`, run the layer's steps, store the pages that changed as `tag`."""

    layer: str
    tag: str
    from_tag: str

    @property
    def key(self) -> str:
        return f"ForkLayer/{self.layer}"

    @property
    def owner(self) -> Owner:
        return ("ForkLayer", self.layer)


@dataclass(frozen=True)
class BuildBranch:
    """Snapshot the running child `child` as `tag` (live, diff or full)."""

    branch: str
    child: str
    tag: str
    mode: str

    @property
    def key(self) -> str:
        return f"ForkBranch/{self.branch}"

    @property
    def owner(self) -> Owner:
        return ("ForkBranch", self.branch)


@dataclass(frozen=True)
class CompactSnapshot:
    """Write the chain head `from_tag` as the base snapshot `tag`, which `pool` then spawns from."""

    pool: str
    from_tag: str
    tag: str
    reason: str

    @property
    def key(self) -> str:
        return f"Compact/{self.tag}"

    @property
    def owner(self) -> Owner:
        return ("ForkPool", self.pool)


@dataclass(frozen=True)
class SpawnChildren:
    """Restore `count` idle children of `tag` for `pool`."""

    pool: str
    tag: str
    count: int

    @property
    def key(self) -> str:
        return f"ForkPool/{self.pool}"

    @property
    def owner(self) -> Owner:
        return ("ForkPool", self.pool)


@dataclass(frozen=True)
class RetireChild:
    """Stop a child and drop its record. `reason`: scale-down | rollout | dead | expired | orphaned |
    claim-deleted."""

    pool: str | None
    child: str
    reason: str

    @property
    def key(self) -> str:
        return f"child/{self.child}"

    @property
    def owner(self) -> Owner:
        return ("ForkPool", self.pool) if self.pool else None


@dataclass(frozen=True)
class DeleteSnapshot:
    """Remove a reconciler-built snapshot nothing references any more."""

    tag: str
    reason: str

    @property
    def key(self) -> str:
        return f"snapshot/{self.tag}"

    @property
    def owner(self) -> Owner:
        return None


@dataclass(frozen=True)
class ClaimChildren:
    """Claim `count` children of `pool` for the ForkClaim `claim` (forked from `from_tag` when it names a branch's
    snapshot; else warm ones, through the pool's claim path); they are released `ttl` seconds after the claim, or
    at `shutdown_at` (Unix time), or never (both None)."""

    claim: str
    pool: str
    count: int
    from_tag: str | None
    ttl: float | None
    shutdown_at: float | None

    @property
    def key(self) -> str:
        return f"ForkClaim/{self.claim}"

    @property
    def owner(self) -> Owner:
        return ("ForkClaim", self.claim)


@dataclass(frozen=True)
class ForgetClaim:
    """Drop the record of a deleted ForkClaim whose children are all gone."""

    claim: str

    @property
    def key(self) -> str:
        return f"claim-record/{self.claim}"

    @property
    def owner(self) -> Owner:
        return None


Action = (BuildParent | BuildLayer | BuildBranch | CompactSnapshot | SpawnChildren | RetireChild | DeleteSnapshot
          | ClaimChildren | ForgetClaim)
