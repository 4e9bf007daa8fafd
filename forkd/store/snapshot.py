"""The snapshot record: a frozen value with a JSON sidecar (`snapshot.json`) beside its files."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from forkd.base.errors import ForkdError
from forkd.base.names import TAG_PATTERN

MANIFEST = "snapshot.json"
MEMORY = "memory.bin"
VMSTATE = "vmstate"
DISK = "disk.qcow2"  # disk-backed images: what this snapshot's guest wrote, an overlay (see forkd.vmm.disk)
FORMAT_VERSION = 1
STATUSES = ("writing", "ready", "failed")
# fields that become file names or are compared to content: checked whenever a record is loaded, so a hostile
# pack or a tampered snapshot.json can never name a path outside the store (e.g. memory_sha256 "../../x")
DIGESTS = ("memory_sha256", "vmstate_sha256", "parent_content_hash", "diff_sha256", "disk_sha256")
COUNTS = ("memory_mib", "vcpus", "memory_bytes", "memory_stored_bytes", "vmstate_bytes", "diff_pages", "disk_bytes")
MAX_LABELS = 64
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_TAG_RE = re.compile(TAG_PATTERN)


class CorruptManifest(ForkdError):
    """A snapshot record that cannot be read; `dirname`: its directory's name (the tag it would have)."""

    dirname: str | None = None


@dataclass(frozen=True)
class Snapshot:
    tag: str
    status: str
    created_at: float
    memory_mib: int
    vcpus: int
    accel: str
    image_id: str
    kernel_sha256: str
    qemu_version: str
    warm_imports: tuple[str, ...] = ()
    warm_run: tuple[str, ...] = ()
    warm_exec: tuple[str, ...] = ()
    memory_sha256: str | None = None
    vmstate_sha256: str | None = None
    memory_bytes: int = 0  # logical size of the memory file
    memory_stored_bytes: int = 0  # bytes allocated on disk (the file is sparse)
    vmstate_bytes: int = 0
    parent_tag: str | None = None  # set for layers: the snapshot this one is a diff against
    parent_content_hash: str | None = None  # the parent's memory_sha256 when this layer was built
    diff_pages: int = 0  # layers: pages stored in diff.pages / diff.data
    diff_sha256: str | None = None  # layers: sha256 over diff.pages then diff.data
    writer_pid: int | None = None
    writer_started: int | None = None
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # e.g. forkd.dev/parent, forkd.dev/spec-hash
    network: str = "none"  # none | isolated: isolated parents have a NIC, so their children must be isolated
    disk_sha256: str | None = None  # disk-backed images: sha256 of DISK as committed (None: no disk)
    disk_bytes: int = 0  # DISK's allocated size
    format: int = FORMAT_VERSION

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def has_disk(self) -> bool:
        return self.disk_sha256 is not None

    @property
    def is_layer(self) -> bool:
        return self.parent_tag is not None

    def with_(self, **changes: Any) -> Snapshot:
        return replace(self, **changes)

    def to_json(self) -> dict:
        d = asdict(self)
        d["warm_imports"] = list(self.warm_imports)
        d["warm_run"] = list(self.warm_run)
        d["warm_exec"] = list(self.warm_exec)
        return d

    @classmethod
    def from_file(cls, path: Path) -> Snapshot:
        try:
            return cls._read(path)
        except CorruptManifest as exc:
            exc.dirname = path.parent.name
            raise

    @classmethod
    def _read(cls, path: Path) -> Snapshot:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise CorruptManifest(f"snapshot manifest {path} is unreadable: {exc}",
                                  hint=f"remove it with 'forkd snapshot rm --force {path.parent.name}'") from exc
        try:
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            check_fields(raw, path.parent.name)
            raw["warm_imports"] = tuple(raw.get("warm_imports", ()))
            raw["warm_run"] = tuple(raw.get("warm_run", ()))
            raw["warm_exec"] = tuple(raw.get("warm_exec", ()))
            known = {f for f in cls.__dataclass_fields__}
            return cls(**{k: v for k, v in raw.items() if k in known})
        except (TypeError, ValueError) as exc:
            raise CorruptManifest(f"snapshot manifest {path} is invalid: {exc}",
                                  hint=f"remove it with 'forkd snapshot rm --force {path.parent.name}'") from exc


def is_sha256(value: object) -> bool:
    """A lowercase hex sha256 digest (what every content hash in a record must be)."""
    return isinstance(value, str) and bool(_SHA_RE.match(value))


def check_fields(raw: dict, dirname: str) -> None:
    """ValueError naming the first field of a snapshot record (raw JSON) that is not of its shape: tags and the
    image id follow the tag rule (the tag is also its directory's name), digests are hex sha256 or null, counts
    are non-negative integers, labels a small string mapping."""
    if raw.get("status") not in STATUSES:
        raise ValueError(f"status {raw.get('status')!r} is not one of {', '.join(STATUSES)}")
    for key in ("tag", "image_id"):
        if not isinstance(raw.get(key), str) or not _TAG_RE.match(raw[key]):
            raise ValueError(f"{key} {raw.get(key)!r} is not a valid name")
    if raw["tag"] != dirname:
        raise ValueError(f"tag {raw['tag']!r} is not its directory's name {dirname!r}")
    parent = raw.get("parent_tag")
    if parent is not None and (not isinstance(parent, str) or not _TAG_RE.match(parent) or parent == raw["tag"]):
        raise ValueError(f"parent_tag {parent!r} is not a valid tag")
    for key in DIGESTS:
        if raw.get(key) is not None and not is_sha256(raw[key]):
            raise ValueError(f"{key} {raw[key]!r} is not a sha256 hex digest")
    for key in COUNTS:
        v = raw.get(key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 53:
            raise ValueError(f"{key} {v!r} is not a non-negative integer")
    labels = raw.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 253 and len(v) <= 1024 for k, v in labels.items()):
        raise ValueError(f"labels must map at most {MAX_LABELS} names to strings")
