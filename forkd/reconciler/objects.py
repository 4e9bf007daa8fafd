"""Durable store of applied declarative objects: one JSON file per object
(`objects/<Kind>/<namespace>/<name>.json`) with the document, its generation, the apply set it came from and its
status; plus a short event log per object, and the record of what each ForkClaim holds
(`objects/.claims/<qualified name>.json`: kept after the claim is deleted, until the reconciler has retired its
children).

Every method taking a `name` takes a qualified name (forkd.spec.namespaces: "name" in the namespace "default",
"ns.name" in another), the names the reconciler plans with.

`metadata.generation` moves only when the spec changes; `metadata.creationTimestamp` is set when an object is
first stored. Writes are atomic (temp file + rename) and serialized
between processes by a lock file.
"""

from __future__ import annotations

import json
import re
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.base.atomic import write_bytes, write_json
from forkd.base.errors import NotFound
from forkd.base.locks import file_lock
from forkd.base.names import NAME_PATTERN
from forkd.base.paths import Layout
from forkd.reconciler.state import ClaimRecord
from forkd.spec.models import KINDS, MODELS, ForkObject, Status, spec_dict
from forkd.spec.namespaces import NAMESPACE_PATTERN, qname, split_qname

APPLYSET = "forkd.dev/applyset"
MANAGED_BY = "forkd.dev/managed-by"
MAX_EVENTS = 20
_NAME_RE, _NS_RE = re.compile(NAME_PATTERN), re.compile(NAMESPACE_PATTERN)


@dataclass(frozen=True)
class Stored:
    obj: ForkObject  # with metadata.generation set, status as last computed
    applyset: str | None
    source: str | None  # file:line it was applied from
    updated_at: float


def key(obj: ForkObject) -> str:
    """The qualified name an object is stored and planned under."""
    return qname(obj.metadata.namespace, obj.metadata.name)


class ObjectStore:
    def __init__(self, layout: Layout):
        self.root = layout.ensure().objects

    def locked(self) -> AbstractContextManager[None]:
        return file_lock(self.root / ".lock")

    def _path(self, kind: str, name: str, suffix: str = ".json") -> Path:
        ns, plain = split_qname(name)
        if not _NAME_RE.match(plain) or not _NS_RE.match(ns):  # names come from HTTP paths too: no "../"
            raise NotFound(f"{kind}/{name} not found", hint="a name is 1-52 of a-z, 0-9 and '-' (a namespace "
                           "1-63), optionally prefixed by 'NAMESPACE.'")
        return self.root / kind / ns / f"{plain}{suffix}"

    def _read(self, path: Path) -> Stored:
        raw = json.loads(path.read_text())
        obj = MODELS[raw["document"]["kind"]].model_validate(raw["document"])
        return Stored(obj, raw.get("applyset"), raw.get("source"), raw.get("updated_at", 0.0))

    def _write(self, st: Stored) -> None:
        path = self._path(st.obj.kind, key(st.obj))
        path.parent.parent.mkdir(mode=0o700, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        doc = st.obj.model_dump(mode="json", by_alias=True, exclude_none=True)
        write_json(path,
                   {"document": doc, "applyset": st.applyset, "source": st.source, "updated_at": st.updated_at})

    # -- reading -----------------------------------------------------------------------------------
    def get(self, kind: str, name: str) -> Stored:
        try:
            return self._read(self._path(kind, name))
        except FileNotFoundError:
            raise NotFound(f"{kind}/{name} not found", hint="list objects with 'forkd get parents|pools'") from None

    def list(self, kind: str | None = None, namespace: str | None = None) -> list[Stored]:
        """Objects of one kind (None: every kind), of one namespace (None: every namespace)."""
        out = []
        for k in [kind] if kind else KINDS:
            d = self.root / k
            if d.is_dir():
                for nsdir in sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink()):
                    if namespace is None or nsdir.name == namespace:
                        out += [self._read(p) for p in sorted(nsdir.glob("*.json"))]
        return out

    # -- changes -----------------------------------------------------------------------------------
    def plan_put(self, obj: ForkObject) -> tuple[str, int]:
        """What applying `obj` would do: ("created" | "configured" | "unchanged", resulting generation)."""
        try:
            old = self.get(obj.kind, key(obj))
        except NotFound:
            return "created", 1
        if spec_dict(old.obj) != spec_dict(obj):
            return "configured", old.obj.metadata.generation + 1
        if (old.obj.metadata.labels, old.obj.metadata.annotations) != (obj.metadata.labels,
                                                                      obj.metadata.annotations):
            return "configured", old.obj.metadata.generation
        return "unchanged", old.obj.metadata.generation

    def put(self, obj: ForkObject, applyset: str | None, source: str | None) -> tuple[str, ForkObject]:
        change, generation = self.plan_put(obj)
        status, created = None, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if change != "created":
            old = self.get(obj.kind, key(obj)).obj
            status, created = old.status, old.metadata.creationTimestamp or created
        meta = obj.metadata.model_copy(update={"generation": generation, "creationTimestamp": created})
        stored = obj.model_copy(update={"metadata": meta, "status": status})
        if change != "unchanged":
            self._write(Stored(stored, applyset, source, time.time()))
            self.event(obj.kind, key(obj), "Applied", f"{change} (generation {generation})")
        return change, stored

    def set_status(self, kind: str, name: str, status: Status) -> bool:
        """Store a new status if it differs. Returns True when something changed."""
        with self.locked():  # read-modify-write: an apply in between must not be undone
            try:
                st = self.get(kind, name)
            except NotFound:
                return False  # deleted meanwhile
            if st.obj.status == status:
                return False
            self._write(Stored(st.obj.model_copy(update={"status": status}), st.applyset, st.source, time.time()))
            return True

    def delete(self, kind: str, name: str) -> None:
        path = self._path(kind, name)
        if not path.exists():
            raise NotFound(f"{kind}/{name} not found")
        path.unlink()
        path.with_suffix(".events.jsonl").unlink(missing_ok=True)

    # -- claim records -----------------------------------------------------------------------------
    def _claims_dir(self) -> Path:
        d = self.root / ".claims"
        d.mkdir(mode=0o700, exist_ok=True)
        return d

    def put_claim(self, rec: ClaimRecord) -> None:
        write_json(self._claims_dir() / f"{rec.name}.json",
                   {"name": rec.name, "children": list(rec.children), "claimed_at": rec.claimed_at,
                    "expires_at": rec.expires_at, "expires_boot": rec.expires_boot, "uid": rec.uid})

    def claims(self) -> list[ClaimRecord]:
        out = []
        for p in sorted(self._claims_dir().glob("*.json")):
            raw = json.loads(p.read_text())
            out.append(ClaimRecord(raw["name"], tuple(raw["children"]), raw["claimed_at"], raw.get("expires_at"),
                                   raw.get("uid", ""), raw.get("expires_boot")))
        return out

    def forget_claim(self, name: str) -> None:
        (self._claims_dir() / f"{name}.json").unlink(missing_ok=True)

    # -- events ------------------------------------------------------------------------------------
    def event(self, kind: str, name: str, reason: str, message: str, type_: str = "Normal") -> None:
        path = self._path(kind, name, ".events.jsonl")
        path.parent.parent.mkdir(mode=0o700, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        lines = path.read_text().splitlines()[-(MAX_EVENTS - 1):] if path.exists() else []
        lines.append(json.dumps({"time": time.time(), "type": type_, "reason": reason, "message": message}))
        write_bytes(path, ("\n".join(lines) + "\n").encode())

    def events(self, kind: str, name: str) -> list[dict[str, Any]]:
        path = self._path(kind, name, ".events.jsonl")
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
