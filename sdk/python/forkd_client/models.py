"""The JSON answers of the daemon's /v1 API as pydantic models (field names are the wire's; unknown fields are
kept, so a newer daemon never breaks this client). They allow dict access too (`sb["id"]`), like upstream's dicts."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Egress = str | dict[str, list[str]]  # "none" | "internet" | {"allow": ["CIDR:port", ...]} (the daemon validates)


class Wire(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer servers may add fields; old clients keep working

    def __getitem__(self, key: str) -> Any:
        """Dict-style access too, so code written for upstream's SDK (which returns dicts) keeps working."""
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class SnapshotInfo(Wire):
    tag: str
    status: str
    dir: str | None = None
    created_at_unix: int = 0
    parent_tag: str | None = None
    branched_from: str | None = None  # source sandbox id when made by POST /v1/sandboxes/{id}/branch
    memory_mib: int = 0
    vcpus: int = 1
    accel: str | None = None
    memory_bytes: int = 0
    memory_stored_bytes: int = 0
    error: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class SnapshotDetail(SnapshotInfo):
    depth: int | None = None
    ancestors: list[str] = Field(default_factory=list)
    dependents: list[str] = Field(default_factory=list)
    children: list[str] = Field(default_factory=list)
    logical_bytes: int = 0
    stored_bytes: int = 0
    chain_ok: bool = True
    chain_error: str | None = None


class SandboxInfo(Wire):
    id: str
    snapshot_tag: str
    status: str
    netns: str | None = None
    egress: Egress = "none"
    guest_addr: str | None = None
    created_at_unix: int = 0
    pid: int | None = None
    memory_limit_mib: int | None = None
    memory_mib: int = 0
    pool: str | None = None
    claimed: bool = False
    expires_at_unix: int | None = None
    ready_ms: float | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class ExecResult(Wire):
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False


class EvalResult(Wire):
    result: str | None  # repr of the value (upstream name)
    error: dict[str, Any] | None = None
    exit_code: int = 0
    stdout: str = ""


class PingResult(Wire):
    pong: bool = True


class BranchResult(SnapshotInfo):
    mode: str = "live"
    pause_ms: float | None = None
    returned_ms: float = 0.0
    capture: str | None = None  # pages | write-protect | stop (newer servers)
    capture_note: str | None = None  # why a live branch was not taken by pages (newer servers)


class PortGrant(Wire):
    """A port just opened: its token is shown here only (the daemon keeps its hash)."""

    sandbox_id: str
    port: int
    token: str
    path: str  # /v1/ports/{id}/{port}/{token}/: append to the daemon's base URL
    id: str | None = None  # the grant's id, to revoke just this one (older servers: none)
    created_at: float | None = None


class PortGrantInfo(Wire):
    """An open port as listed: no token (it was shown once, when opened)."""

    id: str
    sandbox_id: str
    port: int
    created_at: float
    path: str  # /v1/ports/{id}/{port}/{token}/ with the literal placeholder {token}


class FileWritten(Wire):
    path: str
    bytes: int


class JobError(Wire):
    """Why a job failed, as the daemon's problem+json would have said it had the call blocked: `status` is the
    HTTP status of the error's kind, so a client raises the same error type (forkd_client.jobs.outcome)."""

    status: int
    type: str
    detail: str
    hint: str | None = None


class Job(Wire):
    """A long verb (a snapshot or image build) running on the daemon: `GET /v1/jobs/{id}` until `state` is
    succeeded (`result`: what the blocking call answered), failed (`error`) or cancelled. `target` names what it
    builds (a snapshot's tag); `phase` is its last progress line; `version` grows with every change."""

    id: str
    kind: str
    state: str
    target: str | None = None
    phase: str | None = None
    result: Any = None
    error: JobError | None = None
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    version: int = 0

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")
