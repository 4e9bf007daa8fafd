"""`ChildView`: a child as every door lists it (the service, the `/v1/children` routes, LocalBackend, RemoteBackend
and the CLI's light client), a standard-library dataclass so `forkd ls` through a daemon loads no pydantic.

Its fields are the child's record (forkd.sandbox.registry.ChildRecord, kept in step by
tests/test_child_listing.py) plus what a reader cannot work out from the record alone: `status`, `vmm_stopped` and
`agent_socket` (None where the socket is on another host). An answer from a newer daemon may carry fields this
one does not know: they are dropped, never an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class ChildView:
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildView:
        """A view from its JSON (a daemon's answer); fields this version does not know are dropped."""
        return cls(**{k: v for k, v in data.items() if k in _NAMES})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def model_dump(self, mode: str = "json", **_: Any) -> dict[str, Any]:
        """The wire models' dump, so printers and FastAPI treat a view like them."""
        return self.to_json()

    def elsewhere(self) -> ChildView:
        """The view as a client on another host sees it: no agent socket (that path is on the daemon's host)."""
        return replace(self, agent_socket=None)

    @property
    def claimed(self) -> bool:
        return self.claimed_at is not None

    def __getitem__(self, key: str) -> Any:
        """Dict-style access, as the wire models allow (`view["id"]`)."""
        if key not in _NAMES:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _NAMES else default


_NAMES = frozenset(f.name for f in fields(ChildView))
