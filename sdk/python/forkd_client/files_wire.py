"""The answers of the daemon's files routes (forkd/api/routes_files.py) as pydantic models: what `sb.files`
returns and the daemon itself answers with (forkd.client.files_wire re-exports them). Unknown fields are kept, so a
newer daemon never breaks this client."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer servers may add fields


class EntryInfo(_Answer):
    """A file, directory, symlink (not followed) or other entry in the guest."""

    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    target: str | None = None  # a symlink's target


class EntryList(_Answer):
    """One page of a listing: `next_cursor` (pass it back as `cursor`) resumes after it; None: nothing is left.
    `skipped`: entries left out because their path would be over 4096 bytes (nothing beneath them is listed)."""

    entries: list[EntryInfo]
    next_cursor: str | None = None
    skipped: int = 0


class Exists(_Answer):
    path: str
    exists: bool


class PathResult(_Answer):
    path: str


class MadeDir(_Answer):
    path: str
    created: bool  # false: it existed already


class Written(_Answer):
    path: str
    bytes: int


class WatchEvent(_Answer):
    """One line of a watch's NDJSON stream. `type`: create, write, remove, rename, chmod; or started (first line:
    `kind` says inotify or poll), overflow (events were lost), keepalive (nothing happened for a while)."""

    type: str
    name: str
    kind: str | None = None
