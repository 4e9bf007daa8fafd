"""The wire models of the files routes (forkd/api/routes_files.py): the answers are the light client's
(forkd_client.files_wire, re-exported here so the server answers exactly what `sb.files` parses); the requests,
which only the server validates, are here (pydantic only)."""

from __future__ import annotations

from typing import Annotated

from forkd_client.files_wire import EntryInfo, EntryList, Exists, MadeDir, PathResult, WatchEvent, Written
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChmodRequest", "EntryInfo", "EntryList", "Exists", "GuestPath", "MadeDir", "MakeDirRequest", "Mode",
           "PathResult", "RenameRequest", "WatchEvent", "Written"]

GuestPath = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$",
                                 description="an absolute path in the guest")]
Mode = Annotated[int, Field(ge=0, le=0o7777, description="permission bits, e.g. 420 (0o644)")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422 that names it, never silently dropped


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
