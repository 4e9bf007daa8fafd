"""On-disk registry of children: one `child.json` per child directory, written atomically under a lock."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from forkd.base.atomic import write_json
from forkd.base.errors import InvalidInput, NotFound
from forkd.base.locks import file_lock
from forkd.base.paths import Layout
from forkd.base.procs import is_alive

RECORD = "child.json"


@dataclass(frozen=True)
class ChildRecord:
    id: str
    snapshot: str
    created_at: float
    dir: str
    memory_mib: int
    vcpus: int
    accel: str
    driver: str = "qemu"
    pid: int | None = None
    started: int | None = None  # process start time (clock ticks): pid-reuse-proof identity
    state: str = "starting"  # starting | running | failed
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    pool: str | None = None  # owning pool; None for children forked by hand
    spawner_pid: int | None = None  # the process restoring it (a 'starting' child whose spawner died is dead)
    spawner_started: int | None = None
    claimed_at: float | None = None
    expires_at: float | None = None  # when a claimed child's ttl ends
    network: str = "none"  # none | isolated
    netns: str | None = None  # its network namespace (isolated), recorded before it is created
    net_addr: str | None = None  # the namespace's leased address on the host bridge
    egress: str | dict[str, list[str]] = "none"  # none | internet | {"allow": [CIDR:port...]} (isolated children)
    cgroup: list[str] | None = None  # its cgroup directories (one per hierarchy), recorded before creation
    memory_limit_mib: int | None = None
    unconstrained: bool = False  # started without a cgroup because the caller allowed it
    runas: str | None = None  # "uid:gid" the VMM dropped to, if any
    oom: bool = False  # the kernel OOM-killed its VMM (memory limit reached)
    labels: dict[str, str] = field(default_factory=dict)  # user metadata (set at create, filterable in list)

    @property
    def alive(self) -> bool:
        return self.pid is not None and is_alive(self.pid, self.started)

    @property
    def oom_killed(self) -> bool:
        """True if its VMM was OOM-killed in its own cgroup (read from the group's counter while it exists)."""
        if self.oom:
            return True
        if not self.cgroup:
            return False
        from forkd.sandbox.cgroups import from_record

        g = from_record(self.cgroup)
        return g is not None and g.oom_kills() > 0

    @property
    def status(self) -> str:
        """What `ls` shows: running, dead (its VMM is gone, or its spawner died mid-start), oom-killed (gone because
        it went past its memory limit), starting, failed."""
        if self.state == "running":
            if self.alive:
                return "running"
            return "oom-killed" if self.oom_killed else "dead"
        if self.state == "starting" and self.spawner_pid and not is_alive(self.spawner_pid, self.spawner_started):
            return "dead"
        return self.state

    @property
    def claimed(self) -> bool:
        return self.claimed_at is not None

    @property
    def agent_socket(self) -> Path:
        return Path(self.dir) / "agent.sock"

    def with_(self, **changes: Any) -> ChildRecord:
        return replace(self, **changes)

    def to_json(self) -> dict:
        return asdict(self)


class Registry:
    def __init__(self, layout: Layout):
        self.layout = layout.ensure()
        self.root = layout.children
        self._cache: dict[str, tuple[tuple[int, int], ChildRecord]] = {}

    def locked(self) -> AbstractContextManager[None]:
        """Inter-process lock for changes that must not interleave (e.g. rmi vs fork)."""
        return file_lock(self.root / ".lock")

    def new_id(self) -> str:
        while True:
            cid = "c" + secrets.token_hex(5)
            if not (self.root / cid).exists():
                return cid

    def path(self, child_id: str) -> Path:
        if not child_id or "/" in child_id or child_id.startswith("."):
            raise InvalidInput(f"invalid child id {child_id!r}")
        return self.root / child_id

    def save(self, rec: ChildRecord) -> ChildRecord:
        d = self.path(rec.id)
        if rec.id not in self._cache:
            d.mkdir(mode=0o700, exist_ok=True)
        # Atomic but not fsynced: a record matters only while its VMM process lives, and whatever could lose
        # the page cache (power loss, kernel crash) kills every VMM too. A daemon kill -9 loses nothing.
        write_json(d / RECORD, rec.to_json(), mode=0o600, durable=False)
        return rec

    def get(self, child_id: str) -> ChildRecord:
        try:
            raw = json.loads((self.path(child_id) / RECORD).read_text())
        except FileNotFoundError:
            raise NotFound(f"no child {child_id!r}", hint="list children with 'forkd ls'") from None
        except ValueError as exc:
            raise NotFound(f"child {child_id!r} has an unreadable record: {exc}",
                           hint=f"remove it with 'forkd kill {child_id}'") from exc
        known = set(ChildRecord.__dataclass_fields__)
        return ChildRecord(**{k: v for k, v in raw.items() if k in known})

    def list(self) -> list[ChildRecord]:
        """Every record. Parsed records are cached and re-read only when their file was replaced (records are
        written by rename, so a new inode means new content): listing is a directory scan plus stats."""
        out, seen = [], set()
        with os.scandir(self.root) as it:
            for entry in it:
                if not entry.is_dir() or entry.name.startswith("."):
                    continue
                try:
                    st = os.stat(os.path.join(entry.path, RECORD))
                except FileNotFoundError:
                    continue
                seen.add(entry.name)
                hit = self._cache.get(entry.name)
                if hit is None or hit[0] != (st.st_ino, st.st_mtime_ns):
                    try:
                        hit = ((st.st_ino, st.st_mtime_ns), self.get(entry.name))
                    except NotFound:
                        continue
                    self._cache[entry.name] = hit
                out.append(hit[1])
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return sorted(out, key=lambda r: (r.created_at, r.id))

    def remove(self, child_id: str) -> None:
        shutil.rmtree(self.path(child_id), ignore_errors=True)
