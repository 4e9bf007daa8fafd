"""On-disk registry of children: one `child.json` per child directory, written atomically, plus one claims log.

Who writes what (so no two operations write one file at the same time):
  * `child.json` is written by the operation that owns the child at that moment: its spawner while it is
    `starting` (nobody else may kill or remove it then), the reconciler or a user's kill once it is `stopping`;
  * the claims log (`.claims.log`, forkd.sandbox.claims) is appended to only under `locked()`: a claim of n warm
    children is one appended line (one transaction), not n record writes. A child forked for a claim carries its
    claim in its own record from birth, so it is never an idle pool member.
A record's claim is its own fields, else its entry in the log; entries of removed children go when it is compacted.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from forkd.base.atomic import write_json
from forkd.base.errors import InvalidInput, NotFound
from forkd.base.locks import file_lock
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.procs import is_alive, is_stopped, start_time
from forkd.sandbox.claims import CLAIMS, Claim, ClaimsLog
from forkd.sandbox.claims import line as claims_log_line
from forkd.sandbox.lockpaths import registry_lock

CHILD_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")  # forkd makes "c" + 10 hex digits

__all__ = ["CLAIMS", "RECORD", "ChildRecord", "Claim", "Registry", "this_process"]

RECORD = "child.json"
RESIDENCY = ("awake", "paged", "asleep")  # written only by forkd.sandbox.child, under the registry lock


def this_process() -> tuple[int, int | None]:
    """(pid, start time) of the calling process: who is acting on a child (spawner, stopper)."""
    pid = os.getpid()
    return pid, start_time(pid)


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
    state: str = "starting"  # starting | running | stopping | failed
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    pool: str | None = None  # owning pool; None for children forked by hand
    spawner_pid: int | None = None  # the process restoring it (a 'starting' child whose spawner died is dead)
    spawner_started: int | None = None
    claimed_at: float | None = None
    expires_at: float | None = None  # when a claimed child's ttl ends
    expires_boot: float | None = None  # the same end on CLOCK_BOOTTIME (forkd.base.clock): what is compared
    network: str = "none"  # none | isolated
    netns: str | None = None  # its network namespace (isolated), recorded before it is created
    net_addr: str | None = None  # the namespace's leased address on the host bridge
    egress: str | dict[str, list[str]] = "none"  # none | internet | {"allow": [CIDR:port...]} (isolated children)
    cgroup: list[str] | None = None  # its cgroup directories (one per hierarchy), recorded before creation
    memory_limit_mib: int | None = None
    unconstrained: bool = False  # started without a cgroup because the caller allowed it
    runas: str | None = None  # "uid:gid" the VMM dropped to, if any
    oom: bool = False  # the kernel OOM-killed its VMM (memory limit reached)
    stopper_pid: int | None = None  # the process stopping it (a 'stopping' child whose stopper died is dead)
    stopper_started: int | None = None
    labels: dict[str, str] = field(default_factory=dict)  # user metadata (set at create, filterable in list)
    residency: str = "awake"  # awake | paged (its VMM's memory in swap) | asleep (vCPUs stopped): RESIDENCY
    wakes: int = 0  # requests that resumed it or started paging its memory back in (forkd.sandbox.child)

    @property
    def alive(self) -> bool:
        return self.pid is not None and is_alive(self.pid, self.started)

    @property
    def vmm_stopped(self) -> bool:
        """Its VMM is alive but stopped (SIGSTOP, a tracer): every call on it times out until it is continued or
        killed. Reported beside the status (`forkd ls`), which stays `running`: the child is not lost."""
        return self.pid is not None and is_stopped(self.pid, self.started)

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
        """What `ls` shows: running, dead (its VMM is gone, or its spawner died mid-start, or its stopper mid-stop),
        oom-killed (gone because it went past its memory limit), starting, stopping, failed.

        A `starting` child belongs to its spawner and a `stopping` one to its stopper while that process lives:
        no other operation kills, claims or removes it."""
        if self.state == "running":
            if self.alive:
                return "running"
            return "oom-killed" if self.oom_killed else "dead"
        if self.state == "starting" and self.spawner_pid and not is_alive(self.spawner_pid, self.spawner_started):
            return "dead"
        if self.state == "stopping" and not (self.stopper_pid and is_alive(self.stopper_pid, self.stopper_started)):
            return "dead"
        return self.state

    @property
    def busy(self) -> bool:
        """Another operation (a live spawner or stopper) owns this child right now: leave it alone."""
        return self.status in ("starting", "stopping")

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
        self._claims = ClaimsLog(self.root / CLAIMS)

    def locked(self) -> AbstractContextManager[None]:
        """Inter-process lock for changes that must not interleave (e.g. rmi vs fork)."""
        return file_lock(registry_lock(self.root))

    def update(self, child_id: str, change: Callable[[ChildRecord], ChildRecord | None]) -> ChildRecord | None:
        """Change a child's record from its current content, under `locked()`: `change(record)` returns the new
        record (None: leave it). A change made this way is never lost to another writer's stale copy. The
        record as it is now, or None if the child is gone."""
        with self.locked():
            try:
                rec = self._read(child_id)
            except NotFound:
                return None
            new = change(rec)
            if new is None or new == rec:
                return rec
            return self.save(new)

    def new_id(self) -> str:
        while True:
            cid = "c" + secrets.token_hex(5)
            if not (self.root / cid).exists() and cid not in self.claims():
                return cid

    def path(self, child_id: str) -> Path:
        """A child's directory; the id is checked before it names a path (an id from a client is untrusted: a
        256-byte name was a 500 from the filesystem, found by tests/test_schemathesis.py)."""
        if not CHILD_ID.fullmatch(child_id or ""):
            shown = child_id if len(child_id or "") <= 80 else child_id[:80] + "..."
            raise InvalidInput(f"invalid child id {shown!r}",
                               hint="a child id is 1-64 letters, digits, '_', '.' or '-' (as 'forkd ls' shows them)")
        return self.root / child_id

    def save(self, rec: ChildRecord) -> ChildRecord:
        """Write a child's record; a new child's directory comes into being with its record in it (born under an
        owned name, renamed into place), so a directory of a child id without a record is never a spawn in
        progress: it is a leftover, and gc removes it whatever its age."""
        d = self.path(rec.id)
        # Atomic but not fsynced: a record matters only while its VMM process lives, and whatever could lose
        # the page cache (power loss, kernel crash) kills every VMM too. A daemon kill -9 loses nothing.
        if rec.id in self._cache or d.is_dir() or not self._create(d, rec):
            write_json(d / RECORD, rec.to_json(), mode=0o600, durable=False)
        return rec

    def _create(self, d: Path, rec: ChildRecord) -> bool:
        """Make `d` with `rec` in it in one rename; False if another process made `d` first."""
        tmp = self.root / owned_name(f".{rec.id}.new")
        try:
            tmp.mkdir(mode=0o700)
            write_json(tmp / RECORD, rec.to_json(), mode=0o600, durable=False)
            os.rename(tmp, d)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        return True

    def get(self, child_id: str) -> ChildRecord:
        return _with_claim(self._read(child_id), self.claims())

    def _read(self, child_id: str) -> ChildRecord:
        """The record as its file has it (without the claims log)."""
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
        claims = self.claims()
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
                        hit = ((st.st_ino, st.st_mtime_ns), self._read(entry.name))
                    except NotFound:
                        continue
                    self._cache[entry.name] = hit
                out.append(_with_claim(hit[1], claims))
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return sorted(out, key=lambda r: (r.created_at, r.id))

    def remove(self, child_id: str) -> None:
        """Drop a child's record and directory at once: the directory is first renamed to an owned name (record,
        sockets and logs leave the registry together), then deleted. A process killed while it deletes leaves
        that owned name, which gc removes once its maker is gone; never a directory without its record."""
        grave = self.root / owned_name(f".{child_id}.rm")
        try:
            os.rename(self.path(child_id), grave)
        except FileNotFoundError:
            return
        shutil.rmtree(grave, ignore_errors=True)

    # -- claims ------------------------------------------------------------------------------------
    def claims(self) -> dict[str, Claim]:
        """Child id -> its claim, from the claims log (children claimed from birth carry theirs in the record)."""
        return self._claims.table()

    def claim(self, recs: list[ChildRecord], claim: Claim) -> list[ChildRecord]:
        """Record `recs` as claimed: one appended line of the claims log for the whole batch. Call under
        `locked()`."""
        if not recs:
            return []
        self._claims.append(claims_log_line([r.id for r in recs], claim), self._ids)
        return [_claimed(r, claim) for r in recs]

    def unclaim(self, ids: list[str]) -> None:
        """Give claimed children back to their pool (idle again): a claim that could not be completed, or a
        benchmark's reset. Call under `locked()`."""
        if not ids:
            return
        self._claims.append({"u": list(ids)}, self._ids)
        for cid in ids:  # children claimed from birth carry the claim in their own record
            try:
                rec = self._read(cid)
            except NotFound:
                continue
            if rec.claimed_at is not None:
                self.save(rec.with_(claimed_at=None, expires_at=None, expires_boot=None))

    def _ids(self) -> list[str]:
        return [n for n in os.listdir(self.root) if not n.startswith(".")]


def _with_claim(rec: ChildRecord, claims: dict[str, Claim]) -> ChildRecord:
    c = claims.get(rec.id) if rec.claimed_at is None else None
    return rec if c is None else _claimed(rec, c)


def _claimed(rec: ChildRecord, c: Claim) -> ChildRecord:
    """`rec` with the claim's two fields: a copy of its attributes (dataclasses.replace re-runs __init__ over all
    30 fields, 10x slower, and a batch claim makes one per child)."""
    new = object.__new__(ChildRecord)
    new.__dict__.update(rec.__dict__, claimed_at=c.at, expires_at=c.expires_at,
                        expires_boot=c.expires_boot)
    return new
