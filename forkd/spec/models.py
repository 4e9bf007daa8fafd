"""The declarative objects, Kubernetes-style (apiVersion forkd.dev/v1alpha1): ForkParent, ForkLayer, ForkPool,
ForkBranch. Pure pydantic v2 models: strict (unknown fields are errors), no I/O.

Field names are camelCase as users write them in YAML; Python attributes are snake_case where they differ
(`from` is `from_`). Status follows Kubernetes conventions: observedGeneration plus conditions Ready /
Reconciling / Degraded, and numbers; there is no `phase`.

The fields the core also takes use the field types of forkd.core.requests (a rule is written once), and the
objects build the core's typed requests: ForkParent -> ParentBuild, ForkLayer -> LayerBuild, ForkPool -> Spawn,
ForkBranch -> Branch (a compaction takes nothing from a spec: the reconciler builds its Compaction itself).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, model_serializer, model_validator

from forkd.base.names import NAME_PATTERN
from forkd.core import requests as rq
from forkd.core.requests import (
    EGRESS_DOC,
    MAX_FORK,
    BranchMode,
    Egress,
    MemoryLimitMiB,
    MemoryMiB,
    ModuleName,
    NetworkMode,
    Vcpus,
)

API_VERSION = "forkd.dev/v1alpha1"
KINDS = ("ForkParent", "ForkLayer", "ForkPool", "ForkBranch")
CONDITION_TYPES = ("Ready", "Reconciling", "Degraded")

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Metadata(Strict):
    name: Name
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int = Field(0, ge=0, description="set by forkd: moves only when the spec changes")


class Condition(Strict):
    type: Literal["Ready", "Reconciling", "Degraded"]
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str = ""


class Status(Strict):
    observedGeneration: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    node: str | None = Field(None, description="Kubernetes: the node daemon the operator placed this object on")

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


# -- ForkParent -------------------------------------------------------------------------------------
RootfsKind = Literal["auto", "initramfs", "disk"]
ROOTFS_DOC = ("how the rootfs reaches the guest: initramfs (in guest RAM), disk (an ext4 root disk; each child "
              "writes its own copy-on-write overlay) or auto (disk above 1 GiB); unset means auto")


class _DropNone(Strict):
    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> Any:  # unset options stay out of spec hashes
        return {k: v for k, v in handler(self).items() if v is not None}


class OciImage(_DropNone):
    ref: str = Field(..., min_length=1, description="an OCI image layout directory or a `docker save` tarball")
    rootfs: RootfsKind | None = Field(None, description=ROOTFS_DOC)


class DebianImage(_DropNone):
    suite: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{1,30}$")] = "bookworm"
    packages: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9+.-]+$")]] = Field(
        default_factory=list, description="Debian packages installed next to python3 (mmdebstrap)")
    rootfs: RootfsKind | None = Field(None, description=ROOTFS_DOC)


class ImageRef(Strict):
    """Exactly one of builtin | oci | debian (none given: builtin python)."""

    builtin: Literal["python"] | None = None
    oci: OciImage | None = None
    debian: DebianImage | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_builtin(cls, data: Any) -> Any:
        if isinstance(data, dict) and all(data.get(k) is None for k in ("builtin", "oci", "debian")):
            return {**data, "builtin": "python"}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> ImageRef:
        given = [k for k in ("builtin", "oci", "debian") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"image: give exactly one of builtin, oci, debian (got {', '.join(given)})")
        return self

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> Any:  # {builtin: python} stays what it was: spec hashes don't move
        return {k: v for k, v in handler(self).items() if v is not None}


class Warmup(Strict):
    imports: list[ModuleName] = Field(default_factory=list, description="modules imported in the guest agent")
    run: list[str] = Field(default_factory=list, description="shell commands run in the guest before the pause")
    exec: list[str] = Field(default_factory=list, description="Python code run in the agent's interpreter")


class ForkParentSpec(Strict):
    image: ImageRef = Field(default_factory=ImageRef)
    memoryMiB: MemoryMiB = 512
    vcpus: Vcpus = 1
    warmup: Warmup = Field(default_factory=Warmup)
    network: NetworkMode = Field(
        "none", description="isolated: the parent gets a NIC and every child runs in its own network namespace; "
                            "pools using it must say child.network: isolated")


class ForkParentStatus(Status):
    snapshot: str | None = None
    specHash: str | None = None


class ForkParent(Strict):
    apiVersion: Literal["forkd.dev/v1alpha1"] = API_VERSION
    kind: Literal["ForkParent"] = "ForkParent"
    metadata: Metadata
    spec: ForkParentSpec = Field(default_factory=ForkParentSpec)
    status: ForkParentStatus | None = None

    def to_request(self, tag: str, image_id: str | None = None,
                   labels: dict[str, str] | None = None) -> rq.ParentBuild:
        """The core's request to build this parent as snapshot `tag` from image `image_id` (None: the default)."""
        s, w = self.spec, self.spec.warmup
        return rq.ParentBuild.of(tag=tag, memory_mib=s.memoryMiB, vcpus=s.vcpus, warm_imports=tuple(w.imports),
                                 warm_run=tuple(w.run), warm_exec=tuple(w.exec), network=s.network,
                                 image_id=image_id, labels=labels or {})


# -- ForkLayer --------------------------------------------------------------------------------------
class ForkLayerSpec(Strict):
    from_: Name = Field(alias="from")
    run: list[str] = Field(default_factory=list)
    imports: list[ModuleName] = Field(default_factory=list)


class ForkLayerStatus(Status):
    snapshot: str | None = None
    chainDepth: int | None = None


class ForkLayer(Strict):
    apiVersion: Literal["forkd.dev/v1alpha1"] = API_VERSION
    kind: Literal["ForkLayer"] = "ForkLayer"
    metadata: Metadata
    spec: ForkLayerSpec
    status: ForkLayerStatus | None = None

    def to_request(self, tag: str, parent_tag: str, labels: dict[str, str] | None = None) -> rq.LayerBuild:
        """The core's request to build this layer as snapshot `tag` on `parent_tag` (its `from`'s snapshot)."""
        return rq.LayerBuild.of(tag=tag, parent_tag=parent_tag, run=tuple(self.spec.run),
                                imports=tuple(self.spec.imports), labels=labels or {})


# -- ForkPool ---------------------------------------------------------------------------------------
# a string or an object: Kubernetes' structural schemas cannot say "one of" those, so the CRD keeps the value as
# given (x-kubernetes-preserve-unknown-fields) and forkd validates it when it loads the object
EgressField = Annotated[Egress, WithJsonSchema({"description": EGRESS_DOC,
                                                "x-kubernetes-preserve-unknown-fields": True})]


class ChildSpec(Strict):
    memoryLimitMiB: MemoryLimitMiB | None = None
    network: NetworkMode = "none"
    egress: EgressField = "none"

    @model_validator(mode="after")
    def _egress_needs_a_nic(self) -> ChildSpec:
        if self.egress != "none" and self.network != "isolated":
            raise ValueError("child.egress applies to isolated children only: set child.network: isolated (and "
                             "spec.network: isolated on the ForkParent), or leave egress at none")
        return self
    ttlSeconds: int | None = Field(None, ge=1, description="claimed children are killed this long after claim")


class SpawnLatencyTarget(Strict):
    p50Ms: int = Field(ge=1)


class Compaction(Strict):
    maxDepth: int = Field(3, ge=1)


class ForkPoolSpec(Strict):
    from_: Name = Field(alias="from", description="a ForkParent or ForkLayer name")
    warm: int = Field(0, ge=0, le=MAX_FORK, description="children kept restored, idle and answering")
    maxChildren: int = Field(64, ge=1, le=MAX_FORK, description="cap on warm + claimed children")
    child: ChildSpec = Field(default_factory=ChildSpec)
    spawnLatencyTarget: SpawnLatencyTarget | None = None
    compaction: Compaction | None = None


class ForkPoolStatus(Status):
    warm: int = 0
    claimed: int = 0
    target: int = 0
    snapshot: str | None = None
    chainDepth: int = 0
    spawnP50Ms: float | None = None
    lastCompaction: str | None = None


class ForkPool(Strict):
    apiVersion: Literal["forkd.dev/v1alpha1"] = API_VERSION
    kind: Literal["ForkPool"] = "ForkPool"
    metadata: Metadata
    spec: ForkPoolSpec
    status: ForkPoolStatus | None = None

    def to_request(self, tag: str, n: int) -> rq.Spawn:
        """The core's request to restore `n` children of snapshot `tag` for this pool (their network follows the
        snapshot's; the reconciler refuses a pool whose child.network does not match its parent's)."""
        return rq.Spawn.of(tag=tag, n=n, pool=self.metadata.name, memory_limit_mib=self.spec.child.memoryLimitMiB,
                           egress=self.spec.child.egress)


# -- ForkBranch -------------------------------------------------------------------------------------
class ForkBranchSpec(Strict):
    sandbox: str = Field(min_length=1, description="a child id, or pool/<name> for one of its claimed children")
    mode: BranchMode = "live"
    wait: bool = False


class ForkBranchStatus(Status):
    snapshot: str | None = None


class ForkBranch(Strict):
    apiVersion: Literal["forkd.dev/v1alpha1"] = API_VERSION
    kind: Literal["ForkBranch"] = "ForkBranch"
    metadata: Metadata
    spec: ForkBranchSpec
    status: ForkBranchStatus | None = None

    def to_request(self, child_id: str, tag: str, labels: dict[str, str] | None = None) -> rq.Branch:
        """The core's request to snapshot the running child `child_id` as `tag` (the reconciler waits for it)."""
        return rq.Branch.of(child_id=child_id, tag=tag, mode=self.spec.mode, wait=True, labels=labels or {})


ForkObject = ForkParent | ForkLayer | ForkPool | ForkBranch
MODELS: dict[str, type[Strict]] = {"ForkParent": ForkParent, "ForkLayer": ForkLayer, "ForkPool": ForkPool,
                                   "ForkBranch": ForkBranch}
# plural / short names for `forkd get`
RESOURCE_NAMES = {"parents": "ForkParent", "parent": "ForkParent", "forkparent": "ForkParent",
                  "layers": "ForkLayer", "layer": "ForkLayer", "forklayer": "ForkLayer",
                  "pools": "ForkPool", "pool": "ForkPool", "forkpool": "ForkPool",
                  "branches": "ForkBranch", "branch": "ForkBranch", "forkbranch": "ForkBranch"}


def spec_dict(obj: ForkObject) -> dict[str, Any]:
    """The spec as the user wrote it (aliases, defaults filled in): what generation and hashes are over."""
    return obj.spec.model_dump(mode="json", by_alias=True)


def spec_hash(obj: ForkObject) -> str:
    """Stable hash of the spec: changes exactly when the spec changes."""
    raw = json.dumps(spec_dict(obj), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


def to_document(obj: ForkObject, with_status: bool = True) -> dict[str, Any]:
    d = obj.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not with_status:
        d.pop("status", None)
    return d
