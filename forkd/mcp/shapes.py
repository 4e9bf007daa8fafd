"""What forkd-mcp's tools answer: each tool's output schema. Only what a model can use: no host paths, host pids
or network namespace names (a sandbox's world is the guest), and names that match the tools' arguments."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Egress = str | dict[str, list[str]]


class Shape(BaseModel):
    model_config = ConfigDict(extra="ignore")  # what the daemon answers beyond these stays out (host details)

    @classmethod
    def of(cls, wire: Any) -> Any:
        return cls.model_validate(wire.model_dump(mode="json") if hasattr(wire, "model_dump") else wire)


class Snapshot(Shape):
    tag: str
    status: str
    parent_tag: str | None = None
    branched_from: str | None = None
    memory_mib: int = 0
    vcpus: int = 1
    memory_bytes: int = 0
    memory_stored_bytes: int = 0
    created_at_unix: int = 0
    error: str | None = None
    labels: dict[str, str] = {}


class Snapshots(Shape):
    snapshots: list[Snapshot]


class SnapshotDetail(Snapshot):
    depth: int | None = None
    ancestors: list[str] = []
    dependents: list[str] = []
    children: list[str] = []
    logical_bytes: int = 0
    stored_bytes: int = 0
    chain_ok: bool = True
    chain_error: str | None = None


class Branched(Snapshot):
    mode: str = "live"
    pause_ms: float | None = None


class Sandbox(Shape):
    id: str
    snapshot_tag: str
    status: str
    egress: Egress = "none"
    memory_mib: int = 0
    pool: str | None = None
    claimed: bool = False
    created_at_unix: int = 0
    expires_at_unix: int | None = None
    labels: dict[str, str] = {}


class Sandboxes(Shape):
    sandboxes: list[Sandbox]


class Killed(Shape):
    killed: str


class Pong(Shape):
    pong: bool


class Evaluated(Shape):
    result: str | None = None
    error: dict[str, Any] | None = None
    exit_code: int = 0
    stdout: str = ""


class Executed(Shape):
    """The first page of each stream; `output_id` and `*_next_offset` (not null) say there is more: read_output."""
    exit_code: int
    timed_out: bool = False
    truncated: bool = False  # the daemon capped the command's output
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_next_offset: int | None = None
    stderr_next_offset: int | None = None
    output_id: str | None = None


class OutputPage(Shape):
    output_id: str
    stream: Literal["stdout", "stderr"]
    offset: int
    data: str
    next_offset: int | None  # null: this page ends the stream
    total_bytes: int


class FileContent(Shape):
    path: str
    encoding: Literal["utf-8", "base64"]
    content: str
    bytes: int


class FileWritten(Shape):
    path: str
    bytes: int


class Entry(Shape):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    target: str | None = None


class Entries(Shape):
    """One page: pass `next_cursor` back as `cursor` for the next; null: nothing is left."""
    entries: list[Entry]
    next_cursor: str | None = None


class Port(Shape):
    sandbox_id: str
    port: int
    url: str  # with the daemon's TCP address; over its unix socket, the path under it
    grant_id: str | None = None  # to revoke just this URL (close_port's grant_id)


class PortInfo(Shape):
    """A port as listed: its URL's token is not shown again (the placeholder {token} stands for it)."""

    sandbox_id: str
    port: int
    grant_id: str
    url: str


class Ports(Shape):
    ports: list[PortInfo]


class PortClosed(Shape):
    sandbox_id: str
    port: int | None = None
    grant_id: str | None = None
    closed: bool
