"""The wire models of the files routes (forkd/api/routes_files.py): what the daemon answers and takes, shared by
the server, forkd.client.files_remote and the SDK (pydantic only)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

GuestPath = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$",
                                 description="an absolute path in the guest")]
Mode = Annotated[int, Field(ge=0, le=0o7777, description="permission bits, e.g. 420 (0o644)")]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer servers may add fields


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422 that names it, never silently dropped


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
    entries: list[EntryInfo]


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


class RenameRequest(_Request):
    src: GuestPath
    dst: GuestPath


class MakeDirRequest(_Request):
    path: GuestPath
    parents: bool = True
    mode: Mode = 0o755


class ChmodRequest(_Request):
    path: GuestPath
    mode: Mode


class WatchEvent(_Answer):
    """One line of a watch's NDJSON stream. `type`: create, write, remove, rename, chmod; or started (first line:
    `kind` says inotify or poll), overflow (events were lost), keepalive (nothing happened for a while)."""

    type: str
    name: str
    kind: str | None = None
