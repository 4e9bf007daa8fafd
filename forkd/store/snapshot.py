"""The snapshot record: a frozen value with a JSON sidecar (`snapshot.json`) beside its files."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from forkd.base.errors import ForkdError

MANIFEST = "snapshot.json"
MEMORY = "memory.bin"
VMSTATE = "vmstate"
DISK = "disk.qcow2"  # disk-backed images: what this snapshot's guest wrote, an overlay (see forkd.vmm.disk)
FORMAT_VERSION = 1
STATUSES = ("writing", "ready", "failed")


class CorruptManifest(ForkdError):
    pass


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
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise CorruptManifest(f"snapshot manifest {path} is unreadable: {exc}",
                                  hint=f"remove it with 'forkd rmi --force {path.parent.name}'") from exc
        try:
            if raw.get("status") not in STATUSES:
                raise ValueError(f"status {raw.get('status')!r} is not one of {', '.join(STATUSES)}")
            raw["warm_imports"] = tuple(raw.get("warm_imports", ()))
            raw["warm_run"] = tuple(raw.get("warm_run", ()))
            raw["warm_exec"] = tuple(raw.get("warm_exec", ()))
            known = {f for f in cls.__dataclass_fields__}
            return cls(**{k: v for k, v in raw.items() if k in known})
        except (TypeError, ValueError) as exc:
            raise CorruptManifest(f"snapshot manifest {path} is invalid: {exc}",
                                  hint=f"remove it with 'forkd rmi --force {path.parent.name}'") from exc
