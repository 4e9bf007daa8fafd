"""`ChildView` and `SnapshotView`: a child and a snapshot as every door lists them (the service, the `/v1/children`
and `/v1/snapshots` routes, LocalBackend, RemoteBackend and the CLI's light client), standard-library dataclasses so
`forkd ls` and `forkd snapshot ls` through a daemon load no pydantic.

A ChildView is the child's record (forkd.sandbox.registry.ChildRecord, kept in step by
tests/test_url_space.py) plus what a reader cannot work out from the record alone: `status`, `vmm_stopped` and
`agent_socket` (None where the socket is on another host). A SnapshotView is the snapshot's record
(forkd.store.snapshot.Snapshot, kept in step by tests/test_snapshot_routes.py) plus upstream's `dir`,
`created_at_unix` and `branched_from` (so it is also upstream's SnapshotInfo, field for field) and `corrupt` (a
record that cannot be read, listed by its directory's name as `failed`). An answer from a newer daemon may carry
fields this one does not know: they are dropped, never an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal


class _View:
    """What both views share: JSON both ways, and the wire models' ways of reading (`view["id"]`, `.get`)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Any:
        """A view from its JSON (a daemon's answer); fields this version does not know are dropped."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def model_dump(self, mode: str = "json", **_: Any) -> dict[str, Any]:
        """The wire models' dump, so printers and FastAPI treat a view like them."""
        return self.to_json()

    def __getitem__(self, key: str) -> Any:
        """Dict-style access, as the wire models allow (`view["id"]`)."""
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: str) -> bool:
        return key in self.__dataclass_fields__  # type: ignore[attr-defined]

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.__dataclass_fields__ else default  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ChildView(_View):
    id: str
    snapshot: str
    created_at: float
    dir: str
    memory_mib: int
    vcpus: int
    accel: str
    driver: str = "qemu"
    pid: int | None = None
    started: int | None = None
    state: str = "starting"
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    pool: str | None = None
    spawner_pid: int | None = None
    spawner_started: int | None = None
    claimed_at: float | None = None
    expires_at: float | None = None
    expires_boot: float | None = None
    network: str = "none"
    netns: str | None = None
    net_addr: str | None = None
    egress: str | dict[str, list[str]] = "none"
    cgroup: list[str] | None = None
    memory_limit_mib: int | None = None
    unconstrained: bool = False
    runas: str | None = None
    oom: bool = False
    stopper_pid: int | None = None
    stopper_started: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    residency: str = "awake"
    wakes: int = 0
    # not on the record: read from the host when the view is made
    status: str = "starting"
    vmm_stopped: bool = False
    agent_socket: str | None = None

    def elsewhere(self) -> ChildView:
        """The view as a client on another host sees it: no agent socket (that path is on the daemon's host)."""
        return replace(self, agent_socket=None)

    @property
    def claimed(self) -> bool:
        return self.claimed_at is not None


@dataclass(frozen=True)
class SnapshotView(_View):
    tag: str
    status: Literal["writing", "ready", "failed"]
    created_at: float = 0.0
    memory_mib: int = 0
    vcpus: int = 1
    accel: str | None = None
    image_id: str | None = None
    kernel_sha256: str | None = None
    qemu_version: str | None = None
    warm_imports: list[str] = field(default_factory=list)
    warm_run: list[str] = field(default_factory=list)
    warm_exec: list[str] = field(default_factory=list)
    memory_sha256: str | None = None
    vmstate_sha256: str | None = None
    memory_bytes: int = 0
    memory_stored_bytes: int = 0
    vmstate_bytes: int = 0
    parent_tag: str | None = None
    parent_content_hash: str | None = None
    diff_pages: int = 0
    diff_sha256: str | None = None
    writer_pid: int | None = None
    writer_started: int | None = None
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    network: str = "none"
    disk_sha256: str | None = None
    disk_bytes: int = 0
    format: int = 1
    # not on the record: upstream's SnapshotInfo fields, and a record that cannot be read
    dir: str | None = None
    created_at_unix: int = 0
    branched_from: str | None = None
    corrupt: bool = False
