"""The declarative objects, Kubernetes-style (apiVersion forkd.dev/v1alpha1): ForkParent, ForkLayer, ForkPool,
ForkBranch, ForkClaim. Pure pydantic v2 models: strict (unknown fields are errors), no I/O. Every field has a
description: they flow into the CRDs (forkd/operator/crdgen.py), the JSON Schemas (`forkd schema`) and
`forkd explain`.

Field names are camelCase as users write them in YAML; Python attributes are snake_case where they differ
(`from` is `from_`). Status follows Kubernetes conventions: observedGeneration plus conditions Ready /
Reconciling / Degraded / Stalled (and Expired on a ForkClaim), and numbers; there is no `phase`.

The fields the core also takes use the field types of forkd.core.requests (a rule is written once), and the
objects build the core's typed requests: ForkParent -> ParentBuild, ForkLayer -> LayerBuild, ForkPool -> Spawn,
ForkBranch -> Branch (a compaction takes nothing from a spec: the reconciler builds its Compaction itself); a
ForkClaim goes through the pool's claim path (forkd.reconciler.control.Control.claim).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, model_serializer, model_validator

from forkd.base.durations import PATTERN as DURATION_PATTERN
from forkd.base.durations import parse_duration
from forkd.base.names import NAME_PATTERN
from forkd.base.presets import PRESETS, preset_packages  # noqa: F401 - PRESETS: for the CLI (forkd image build)
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
from forkd.spec.kinds import API_VERSION, KINDS, PLURALS, RESOURCE_NAMES  # noqa: F401 - the names, re-exported
from forkd.spec.namespaces import NAMESPACE_PATTERN

CONDITION_TYPES = ("Ready", "Reconciling", "Degraded", "Stalled", "Expired")
MAX_CLAIM = 1000  # children one claim may hold (the claim path's own limit)

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Namespace = Annotated[str, StringConstraints(pattern=NAMESPACE_PATTERN)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Metadata(Strict):
    name: Name = Field(description="the object's name: 1-52 of a-z, 0-9 and '-', starting and ending with a "
                                   "letter or digit; unique per kind and namespace")
    namespace: Namespace = Field("default", description="the object's namespace (default: default); references in "
                                                        "its spec name objects of the same namespace")
    labels: dict[str, str] = Field(default_factory=dict, description="free-form key/value labels")
    annotations: dict[str, str] = Field(default_factory=dict, description="free-form key/value annotations "
                                        "(forkd.dev/* ones are forkd's)")
    generation: int = Field(0, ge=0, description="set by forkd: moves only when the spec changes")
    creationTimestamp: str | None = Field(None, description="set by forkd when the object is first applied "
                                                            "(RFC 3339, UTC)")


class Condition(Strict):
    type: Literal["Ready", "Reconciling", "Degraded", "Stalled", "Expired"] = Field(
        description="Ready: as declared; Reconciling: working on it; Degraded: something is wrong; Stalled: "
                    "cannot progress until the spec (or what it names) changes; Expired: a claim's time is up")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown")
    reason: str = Field("", description="one CamelCase word saying why")
    message: str = Field("", description="what happened, for people")
    lastTransitionTime: str = Field("", description="when status last changed (RFC 3339, UTC)")


class Status(Strict):
    observedGeneration: int | None = Field(None, description="the metadata.generation this status was computed "
                                                             "from")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Reconciling, Degraded, Stalled")
    node: str | None = Field(None, description="Kubernetes: the node daemon the operator placed this object on")

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class NodeCopy(Strict):
    node: str = Field(description="the node daemon")
    digest: str = Field(description="the artifact digest of the snapshot it holds")
    via: Literal["built", "pulled"] = Field(description="built there, or pulled by digest from the registry")


class Distribution(Strict):
    """Kubernetes, with FORKD_OPERATOR_REGISTRY: the snapshot built on one node and pulled by digest by the others."""

    snapshot: str = Field(description="the snapshot's tag")
    builtOn: str = Field(description="the node that built it")
    ref: str = Field(description="the OCI artifact it was pushed as, pinned by digest")
    digest: str = Field(description="the artifact's manifest digest (sha256:...)")
    nodes: list[NodeCopy] = Field(default_factory=list, description="each node holding it, and how")


# -- ForkParent -------------------------------------------------------------------------------------
RootfsKind = Literal["auto", "initramfs", "disk"]
ROOTFS_DOC = ("how the rootfs reaches the guest: initramfs (in guest RAM), disk (an ext4 root disk; each child "
              "writes its own copy-on-write overlay) or auto (disk above 1 GiB); unset means auto")


class _DropNone(Strict):
    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> Any:  # unset options stay out of spec hashes
        return {k: v for k, v in handler(self).items() if v is not None}


class OciImage(_DropNone):
    ref: str = Field(..., min_length=1, description="an OCI image layout directory or a `docker save` tarball, on "
                                                    "the node, or docker://HOST/NAME[:TAG][@sha256:DIGEST] from a "
                                                    "registry the node allows (FORKD_IMAGE_REGISTRIES)")
    rootfs: RootfsKind | None = Field(None, description=ROOTFS_DOC)


PresetName = Literal["full", "full-build"]  # the names of forkd.base.presets.PRESETS (a test keeps them equal)


class DebianImage(_DropNone):
    preset: PresetName | None = Field(
        None, description="a named package set installed before `packages`: full (bash, git, curl, "
                          "ca-certificates, python3-pip, python3-venv; commands then run under bash -l -c) or "
                          "full-build (full + build-essential)")
    suite: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{1,30}$")] = Field(
        "bookworm", description="the Debian suite mmdebstrap installs (bookworm, trixie, ...)")
    packages: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9+.-]+$")]] = Field(
        default_factory=list, description="Debian packages installed next to python3 (mmdebstrap)")
    rootfs: RootfsKind | None = Field(None, description=ROOTFS_DOC)

    def all_packages(self) -> list[str]:
        """The preset's packages, then `packages`."""
        return preset_packages(self.preset, self.packages)


class ImageRef(Strict):
    """Exactly one of builtin | oci | debian (none given: builtin python)."""

    builtin: Literal["python"] | None = Field(None, description="forkd's default image: busybox and Python "
                                                                "(what an empty image means)")
    oci: OciImage | None = Field(None, description="an OCI image (layout directory, docker save tarball or registry "
                                                   "reference)")
    debian: DebianImage | None = Field(None, description="a Debian rootfs with python3 and these packages")

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
    image: ImageRef = Field(default_factory=ImageRef, description="the guest image the parent boots: exactly one "
                                                                  "of builtin, oci, debian (none: builtin python)")
    memoryMiB: MemoryMiB = Field(512, description="guest RAM in MiB (128-65536); children share the parent's "
                                                  "pages copy-on-write")
    vcpus: Vcpus = Field(1, description="virtual CPUs of the parent and of every child (1-64)")
    warmup: Warmup = Field(default_factory=Warmup, description="what runs in the parent before it is paused and "
                                                               "snapshotted: every child starts from there")
    network: NetworkMode = Field(
        "none", description="isolated: the parent gets a NIC and every child runs in its own network namespace; "
                            "pools using it must say child.network: isolated")


class ForkParentStatus(Status):
    snapshot: str | None = Field(None, description="the ready snapshot's tag")
    specHash: str | None = Field(None, description="hash of the spec the snapshot was built from")
    distribution: Distribution | None = Field(None, description="Kubernetes: where the snapshot was built and "
                                                                "which nodes pulled it by digest")


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
    from_: Name = Field(alias="from", description="the ForkParent, ForkLayer or ForkBranch this layer is built on")
    run: list[str] = Field(default_factory=list, description="shell commands run in a child of `from` before the "
                                                             "layer's pages are stored")
    imports: list[ModuleName] = Field(default_factory=list, description="modules imported in that child's agent")


class ForkLayerStatus(Status):
    snapshot: str | None = Field(None, description="the ready layer snapshot's tag")
    chainDepth: int | None = Field(None, description="how many diff snapshots lie between it and its base")
    distribution: Distribution | None = Field(None, description="Kubernetes: where the layer was built and which "
                                                                "nodes pulled it by digest")


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
    memoryLimitMiB: MemoryLimitMiB | None = Field(None, description="each child's host memory limit in MiB (its "
                                                  "cgroup; past it the child is OOM-killed); unset: no limit")
    network: NetworkMode = Field("none", description="none (no NIC) or isolated (a NIC in the child's own network "
                                                     "namespace); must match the ForkParent's spec.network")
    egress: EgressField = "none"
    prime: list[rq.PrimeCommand] = Field(default_factory=list, max_length=rq.MAX_PRIME, description=rq.PRIME_DOC)

    @model_validator(mode="after")
    def _egress_needs_a_nic(self) -> ChildSpec:
        if self.egress != "none" and self.network != "isolated":
            raise ValueError("child.egress applies to isolated children only: set child.network: isolated (and "
                             "spec.network: isolated on the ForkParent), or leave egress at none")
        return self
    ttlSeconds: int | None = Field(None, ge=1, description="claimed children are killed this long after claim")


class SpawnLatencyTarget(Strict):
    p50Ms: int = Field(ge=1, description="compact the snapshot chain when the median spawn takes longer (ms)")


class Compaction(Strict):
    maxDepth: int = Field(3, ge=1, description="compact the snapshot chain when it is deeper than this")


class ForkPoolSpec(Strict):
    from_: Name = Field(alias="from", description="the ForkParent, ForkLayer or ForkBranch children fork from")
    warm: int = Field(0, ge=0, le=MAX_FORK, description="children kept restored, idle and answering (the /scale "
                                                        "subresource's replicas)")
    maxChildren: int = Field(64, ge=1, le=MAX_FORK, description="cap on warm + claimed children")
    child: ChildSpec = Field(default_factory=ChildSpec, description="settings of every child")
    spawnLatencyTarget: SpawnLatencyTarget | None = Field(None, description="compact when spawns get slower")
    compaction: Compaction | None = Field(None, description="compact when the snapshot chain gets deeper")


class NodeShare(Strict):
    node: str = Field(description="the node daemon")
    target: int = Field(0, description="warm children the operator asks of this node")
    warm: int = Field(0, description="idle children restored and answering there")
    claimed: int = Field(0, description="children handed out there and not yet retired")


class ForkPoolStatus(Status):
    nodes: list[NodeShare] = Field(default_factory=list, description="Kubernetes: the pool's share on each node "
                                                                     "daemon (the operator's split by capacity)")
    warm: int = Field(0, description="idle children restored and answering")
    claimed: int = Field(0, description="children handed out and not yet retired")
    target: int = Field(0, description="spec.warm the pool converges to")
    replicas: int = Field(0, description="the /scale subresource's replicas: warm children ready")
    selector: str = Field("", description="the /scale subresource's label selector: forkd.dev/pool=<name>")
    snapshot: str | None = Field(None, description="the snapshot tag children fork from")
    chainDepth: int = Field(0, description="how many diff snapshots lie between that snapshot and its base")
    spawnP50Ms: float | None = Field(None, description="median spawn-to-answer time of recent spawns (ms)")
    lastCompaction: str | None = Field(None, description="when and why the chain was last compacted")


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
                           egress=self.spec.child.egress, prime=tuple(self.spec.child.prime))


# -- ForkBranch -------------------------------------------------------------------------------------
class ForkBranchSpec(Strict):
    sandbox: str = Field(min_length=1, description="a child id, or pool/<name> for one of its claimed children")
    mode: BranchMode = Field("live", description="live (a self-contained snapshot; the child stops a few ms while "
                                                 "the pages it wrote are taken, or, past 1/40 of its RAM written, "
                                                 "with a disk or a held agent, while QEMU write-protects all of its "
                                                 "RAM, longer as RAM grows), diff "
                                                 "(it stops only while its device state and the pages it wrote are "
                                                 "taken, a few ms; the result is a layer over the child's snapshot) "
                                                 "or full (it stops while all of its RAM is saved)")
    wait: bool = Field(False, description="kept for compatibility: the reconciler always waits for the snapshot")


class ForkBranchStatus(Status):
    snapshot: str | None = Field(None, description="the branch snapshot's tag")


class ForkBranch(Strict):
    apiVersion: Literal["forkd.dev/v1alpha1"] = API_VERSION
    kind: Literal["ForkBranch"] = "ForkBranch"
    metadata: Metadata
    spec: ForkBranchSpec
    status: ForkBranchStatus | None = None

    def to_request(self, child_id: str, tag: str, labels: dict[str, str] | None = None) -> rq.Branch:
        """The core's request to snapshot the running child `child_id` as `tag` (the reconciler waits for it)."""
        return rq.Branch.of(child_id=child_id, tag=tag, mode=self.spec.mode, wait=True, labels=labels or {})


# -- ForkClaim --------------------------------------------------------------------------------------
DURATION_RE = re.compile(DURATION_PATTERN)  # one format everywhere: forkd.base.durations


def duration_seconds(text: str) -> float:
    """"90s", "5m", "1h30m", "90" -> seconds (forkd.base.durations). Raises ValueError."""
    return parse_duration(text)


def rfc3339_seconds(text: str) -> float:
    """An RFC 3339 time ("2026-12-01T15:00:00Z", "...+02:00") -> Unix seconds. Raises ValueError."""
    t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: end it with Z or +HH:MM")
    return t.timestamp()


Duration = Annotated[str, StringConstraints(pattern=DURATION_RE.pattern)]


class ForkClaimSpec(Strict):
    pool: Name = Field(description="the ForkPool whose warm children are claimed")
    count: int = Field(1, ge=1, le=MAX_CLAIM, description="how many children to claim")
    ttl: Duration | None = Field(None, description="release the children this long after they were claimed (e.g. "
                                                   "30m); unset: the pool's child.ttlSeconds, if any")
    shutdownTime: str | None = Field(None, description="release the children at this time (RFC 3339, e.g. "
                                                       "2026-12-01T18:00:00Z); give ttl or shutdownTime, not both")
    from_: Name | None = Field(None, alias="from", description="a ForkBranch: fork the children from its snapshot "
                                                               "(with the pool's child settings) instead of taking "
                                                               "warm ones")

    @model_validator(mode="after")
    def _one_expiry(self) -> ForkClaimSpec:
        if self.ttl is not None and self.shutdownTime is not None:
            raise ValueError("give ttl or shutdownTime, not both")
        if self.shutdownTime is not None:
            rfc3339_seconds(self.shutdownTime)
        return self


class ClaimedChild(Strict):
    id: str = Field(description="the child's id: forkd exec ID -- CMD, forkd eval ID EXPR")
    snapshot: str = Field("", description="the snapshot it was forked from")
    status: str = Field("", description="running, dead, ...")
    agentSocket: str | None = Field(None, description="its agent's unix socket on the node")
    node: str | None = Field(None, description="Kubernetes: the node daemon that runs it")
    endpoint: str | None = Field(None, description="Kubernetes: that daemon's API URL, for the SDKs with the token "
                                                   "of status.tokenSecret")


class ForkClaimStatus(Status):
    claimed: int = Field(0, description="children held by this claim and still running")
    children: list[ClaimedChild] = Field(default_factory=list, description="the claimed children and how to reach "
                                                                           "them")
    claimedAt: str | None = Field(None, description="when the children were claimed (RFC 3339)")
    expiresAt: str | None = Field(None, description="when the children are released (RFC 3339)")
    tokenSecret: str | None = Field(None, description="Kubernetes: the Secret (key `token`) holding a token that "
                                                      "opens these children, and only them, at their endpoint")


class ForkClaim(Strict):
    apiVersion: Literal["forkd.dev/v1alpha1"] = API_VERSION
    kind: Literal["ForkClaim"] = "ForkClaim"
    metadata: Metadata
    spec: ForkClaimSpec
    status: ForkClaimStatus | None = None


ForkObject = ForkParent | ForkLayer | ForkPool | ForkBranch | ForkClaim
MODELS: dict[str, type[Strict]] = {"ForkParent": ForkParent, "ForkLayer": ForkLayer, "ForkPool": ForkPool,
                                   "ForkBranch": ForkBranch, "ForkClaim": ForkClaim}


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
