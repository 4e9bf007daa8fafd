"""The JSON shapes of the `/v1` REST API, shared by the daemon (forkd.api) and the SDKs (forkd.sdk, forkd.mcp).

Field names follow upstream forkd where it has them (`snapshot_tag`, `created_at_unix`, `timeout_secs`,
`exit_code`, `branched_from`, ...); forkd's own extras are added beside them, never renamed. Converters from
the core's records live here too, so the server and the clients cannot drift apart.

The answers are the light client's models (forkd_client.models: what callers get back), imported from there; where
the daemon promises more than a client should check (a status's values, the shape of labels), the daemon's model
narrows the client's, so the OpenAPI document says it. Requests (`Strict`) are the daemon's alone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from forkd_client import models
from forkd_client.models import EvalResult, ExecResult, FileWritten, PingResult, Wire  # noqa: F401 - the daemon's too
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from forkd.core.requests import EGRESS_DOC, Egress
from forkd.service.listing import ChildView, SnapshotView

SnapshotStatus = Literal["writing", "ready", "failed"]
BranchMode = Literal["full", "diff", "live"]


class Strict(BaseModel):
    """A request body: an unknown field is a 422 that names it (pydantic's extra_forbidden), never dropped."""

    model_config = ConfigDict(extra="forbid")


GUEST_ADDR = "10.42.0.2"  # an isolated child's guest address inside its namespace (= forkd.sandbox.netns.GUEST_ADDR)
LabelKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9_.\/-]{0,62})$")]
LabelMap = Annotated[dict[LabelKey, Annotated[str, StringConstraints(max_length=256)]], Field(max_length=32)]


# -- snapshots ------------------------------------------------------------------------------------
class SnapshotInfo(models.SnapshotInfo):
    status: SnapshotStatus


class SnapshotDetail(models.SnapshotDetail):
    status: SnapshotStatus


class CreateSnapshotRequest(Strict):
    tag: str = Field(min_length=1, max_length=63)
    memory_mib: int = Field(512, ge=128, le=65536)
    vcpus: int = Field(1, ge=1, le=64)
    warm_imports: list[str] = Field(default_factory=list)
    warm_run: list[str] = Field(default_factory=list)
    warm_exec: list[str] = Field(default_factory=list)
    from_tag: str | None = Field(None, description="build a diff layer on this snapshot instead of a new parent")
    labels: dict[str, str] = Field(default_factory=dict)
    # upstream's create_snapshot fields (its MCP server sends them): each honoured or refused, never dropped
    kernel: str | None = Field(None, description="upstream: a guest kernel path; refused (422), see README")
    rootfs: str | None = Field(None, description="upstream: an ext4 rootfs path; refused (422), see README")
    rw: bool | None = Field(None, description="upstream: rootfs writable; every forkd child's disk is a private "
                                              "writable copy, so true is honoured and false refused")
    boot_wait_secs: float | None = Field(None, gt=0, le=3600, description="the parent's boot timeout")
    tap: str | None = Field(None, description="upstream: a host tap device; refused (422): forkd makes its own "
                                              "per-child namespaces (per_child_netns)")


class CompactRequest(Strict):
    to: str = Field(min_length=1, max_length=63)


# -- jobs -----------------------------------------------------------------------------------------
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobError(models.JobError):
    pass


class Job(models.Job):
    state: JobState
    error: JobError | None = None


# -- sandboxes ------------------------------------------------------------------------------------
class SpawnRequest(Strict):
    snapshot_tag: str = Field(min_length=1)
    n: int = Field(1, ge=1, le=1000)
    per_child_netns: bool = False
    memory_limit_mib: int | None = Field(None, ge=64)
    egress: Egress = Field("none", description=EGRESS_DOC + "; needs a snapshot built with network isolated")
    timeout_secs: float = Field(60.0, gt=0, le=600)
    lifetime_secs: float | None = Field(None, gt=0, le=30 * 86400, description=(
        "the sandbox's timeout: the daemon kills it this long after creation unless extended (POST "
        "/v1/sandboxes/{id}/timeout); default FORKD_SANDBOX_TIMEOUT"))
    labels: LabelMap = Field(default_factory=dict, description="metadata shown in list/get, filter with ?label=k=v")
    prewarm: bool = Field(True, description="upstream: return only once each child's guest answers; forkd always "
                                            "does (children are answered before spawn returns), so it is honoured")
    live_fork: bool | None = Field(None, description="upstream: accepted, a no-op: every forkd child can be "
                                                     "branched live (POST /v1/sandboxes/{id}/branch or /fork)")


class TimeoutRequest(Strict):
    timeout_secs: float = Field(gt=0, le=30 * 86400, description="the sandbox now expires this long from now")


class ForkRequest(Strict):
    n: int = Field(1, ge=1, le=1000)
    tag: str | None = Field(None, min_length=1, max_length=63, description="name the branch snapshot (kept)")
    keep: bool = Field(False, description="keep the branch snapshot after the last child is killed")
    lifetime_secs: float | None = Field(None, gt=0, le=30 * 86400)
    labels: LabelMap = Field(default_factory=dict)
    timeout_secs: float = Field(60.0, gt=0, le=600)
    egress: Egress | None = Field(None, description="the new sandboxes' egress; unset: the source's")


class ForkFromRequest(Strict):
    """forkd's own route for `forkd fork --from-sandbox` (answers child views)."""

    n: int = Field(1, ge=1, le=1000)
    tag: str | None = Field(None, min_length=1, max_length=63)
    keep: bool = False
    lifetime: float | None = Field(None, gt=0, le=30 * 86400)
    egress: Egress | None = Field(None, description="the new children's egress; unset: the source's")


class SandboxInfo(models.SandboxInfo):
    labels: LabelMap = Field(default_factory=dict)


class ClaimRequest(Strict):
    n: int = Field(1, ge=1, le=1000)
    lifetime_secs: float | None = Field(None, gt=0, le=30 * 86400, description=(
        "seconds the claimed sandboxes live (extend with POST /v1/sandboxes/{id}/timeout); default: the pool's "
        "child.ttlSeconds, else the daemon's FORKD_SANDBOX_TIMEOUT"))


class ClaimResult(Wire):
    children: list[ChildView]  # the CLI's child view (`forkd claim`)
    sandboxes: list[SandboxInfo] = Field(default_factory=list)
    claim_ms: float = 0.0


class ExecRequest(Strict):
    args: list[str] = Field(min_length=1)
    timeout_secs: float = Field(30, gt=0, le=3600)
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin: str | None = None


class EvalRequest(Strict):
    code: str
    timeout_secs: float = Field(60, gt=0, le=3600)
    mode: Literal["eval", "exec"] = Field("eval", description="eval an expression, or exec statements")


class BranchRequest(Strict):
    tag: str | None = None
    mode: BranchMode = "live"
    wait: bool = True
    diff: bool | None = None  # upstream's older flag: true means mode=diff


class BranchResult(models.BranchResult):
    status: SnapshotStatus
    mode: BranchMode = "live"


# -- forkd's own verbs (the CLI's RemoteBackend; the answers are LocalBackend's JSON) -----------------------
class Forked(Wire):
    """`POST /v1/children`: the children made, as every door lists them."""

    children: list[ChildView]


class KillRequest(Strict):
    ids: list[str] = Field(default_factory=list)
    all: bool = False
    tag: str | None = None


class GcRequest(Strict):
    dry_run: bool = False
    grace: float | None = Field(None, ge=0)


class DoctorRequest(Strict):
    reprobe: bool = False


class ImageBuildRequest(Strict):
    force: bool = False


class DebianBuildRequest(Strict):
    packages: list[str] = Field(min_length=1)
    suite: str | None = None
    force: bool = False
    rootfs: Literal["auto", "initramfs", "disk"] = "auto"


class RegistryPull(Strict):
    authfile: str | None = Field(None, description="registry credentials file on the daemon's host (default: where "
                                                   "skopeo looks: $REGISTRY_AUTH_FILE, auth.json, docker config)")
    cert_dir: str | None = Field(None, description="directory of the registry's CA certificates (*.crt) on the "
                                                   "daemon's host")
    tls_verify: bool = Field(True, description="false: allow plain HTTP and unverified TLS (a test registry)")


class FromImageRequest(Strict):
    ref: str = Field(min_length=1, description="an OCI layout directory or 'docker save' tarball on the daemon's "
                                               "host, or docker://HOST/NAME[:TAG][@sha256:DIGEST]")
    tag: str = Field(min_length=1, max_length=63)
    memory_mib: int = Field(512, ge=128, le=65536)
    vcpus: int = Field(1, ge=1, le=64)
    warm_imports: list[str] = Field(default_factory=list)
    warm_run: list[str] = Field(default_factory=list)
    pip: list[str] = Field(default_factory=list)
    apt: list[str] = Field(default_factory=list)
    rootfs: Literal["auto", "initramfs", "disk"] = "auto"
    registry: RegistryPull | None = Field(None, description="how to reach the registry of a docker:// ref")


class PackRequest(Strict):
    tag: str = Field(min_length=1)
    path: str = Field(min_length=1, description="pack file to write, on the daemon's host")
    level: int = Field(3, ge=1, le=19)


class UnpackRequest(Strict):
    path: str = Field(min_length=1, description="pack file to install, on the daemon's host")


class PullRequest(Strict):
    ref: str = Field(min_length=1)
    hub: str | None = None


class PushRequest(Strict):
    tag: str = Field(min_length=1)
    ref: str = Field(min_length=1)
    hub: str | None = None
    force: bool = False


class SnapshotPushRequest(Strict):
    tag: str = Field(min_length=1, max_length=63, description="chain head to push (with every ancestor)")
    ref: str = Field(min_length=1, max_length=512, description="[docker://]HOST[:PORT]/NAME:TAG to push to")
    registry: RegistryPull | None = Field(None, description="how to reach the registry (as for image pulls)")
    level: int = Field(3, ge=1, le=19, description="zstandard level of the pack")
    owned: bool = Field(False, description="allow tags the reconciler owns (for a puller that pins the digest)")


class SnapshotPullRequest(Strict):
    ref: str = Field(min_length=1, max_length=512, description="[docker://]HOST[:PORT]/NAME@sha256:DIGEST (or :TAG)")
    registry: RegistryPull | None = Field(None, description="how to reach the registry (as for image pulls)")
    owned: bool = Field(False, description="keep the tags and labels the reconciler owns; needs a digest")


# -- errors ---------------------------------------------------------------------------------------
class Problem(Wire):
    """RFC 9457 problem details; `error` repeats `detail` for clients written for upstream's ErrorBody."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    hint: str | None = None
    error: str | None = None


# -- converters (core records -> wire) -------------------------------------------------------------
def snapshot_info(snap: Any, layout_dir: str | None = None) -> SnapshotInfo:
    d = snap.to_json()
    return SnapshotInfo(
        tag=snap.tag, status=snap.status, dir=layout_dir, created_at_unix=int(snap.created_at),
        parent_tag=snap.parent_tag, branched_from=snap.labels.get("forkd.dev/branch-of"),
        memory_mib=snap.memory_mib, vcpus=snap.vcpus, accel=snap.accel, memory_bytes=snap.memory_bytes,
        memory_stored_bytes=snap.memory_stored_bytes, error=snap.error, labels=dict(snap.labels),
        **{k: d[k] for k in ("diff_pages", "image_id", "timings_ms") if k in d})


def child_view(rec: Any) -> ChildView:
    """A child record as every door lists it (forkd.service.listing): its record, status, agent socket."""
    return ChildView.from_json(dict(rec.to_json(), status=rec.status, agent_socket=str(rec.agent_socket),
                                    vmm_stopped=rec.vmm_stopped))


def snapshot_view(snap: Any, layout_dir: str | None = None) -> SnapshotView:
    """A snapshot's record (or the CorruptManifest a listing holds for one that cannot be read: `failed`, `corrupt`,
    named by its directory) as every door lists it (forkd.service.listing)."""
    if not hasattr(snap, "to_json"):
        return SnapshotView(tag=snap.dirname or "?", status="failed", error=snap.message, dir=layout_dir,
                            corrupt=True)
    return SnapshotView.from_json(dict(snap.to_json(), dir=layout_dir, created_at_unix=int(snap.created_at),
                                       branched_from=snap.labels.get("forkd.dev/branch-of")))


def sandbox_info(rec: ChildView) -> SandboxInfo:
    """A child's view as upstream's SandboxInfo (the `/v1/sandboxes` compatibility routes)."""
    return SandboxInfo(
        id=rec.id, snapshot_tag=rec.snapshot, status=rec.status, created_at_unix=int(rec.created_at), pid=rec.pid,
        netns=rec.netns if rec.network == "isolated" else None,  # a VMM's empty namespace is no network to join
        egress=getattr(rec, "egress", "none"), memory_mib=rec.memory_mib, pool=rec.pool,
        claimed=rec.claimed, memory_limit_mib=rec.memory_limit_mib,
        guest_addr=GUEST_ADDR if rec.network == "isolated" else None,
        labels=dict(getattr(rec, "labels", None) or {}),
        expires_at_unix=int(rec.expires_at) if rec.expires_at else None, ready_ms=rec.timings_ms.get("ready"))


def eval_result(res: dict[str, Any]) -> EvalResult:
    """An agent's eval answer ({value, error, stdout, stderr}) as upstream's EvalResult."""
    return EvalResult(result=res.get("value"), error=res.get("error"), exit_code=1 if res.get("error") else 0,
                      stdout=res.get("stdout", ""), stderr=res.get("stderr", ""))


def branch_result(info: SnapshotInfo, res: Any, mode: str) -> BranchResult:
    """A branch's snapshot and how it was taken (forkd.core.branch.BranchResult) as upstream's BranchResult."""
    return BranchResult(**info.model_dump(), mode=mode, pause_ms=res.pause_ms, returned_ms=res.returned_ms,
                        capture=res.capture, capture_note=res.capture_note)


# -- the front door's answers (forkd.client.backends.Backend: LocalBackend and RemoteBackend alike) -----------
class EvalAnswer(Wire):
    """`forkd eval`: the expression's repr (`value`), or the guest's `error` ({type, message, traceback})."""

    value: str | None = None
    error: dict[str, Any] | None = None
    stdout: str = ""


class BranchAnswer(Wire):
    """`forkd branch`: the snapshot as `/v1/snapshots` lists it, the child it came from and how it was taken."""

    snapshot: SnapshotInfo
    source: str | None = None
    mode: BranchMode = "live"
    pause_ms: float | None = None
    returned_ms: float | None = None
    capture: str | None = None
    capture_note: str | None = None


def branch_answer(res: BranchResult) -> BranchAnswer:
    """Upstream's flat BranchResult (what the daemon answers) as the front door's BranchAnswer."""
    keys = set(BranchAnswer.model_fields) - {"snapshot", "source"}
    snap = SnapshotInfo(**{k: v for k, v in res.model_dump().items() if k not in keys})
    return BranchAnswer(snapshot=snap, source=res.branched_from, **{k: getattr(res, k, None) for k in keys})
