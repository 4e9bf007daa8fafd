"""`Controller` / `AsyncController`: the SDK's clients of the daemon's REST API, with upstream forkd's method names.

They are forkd.client's HTTP clients (forkd.client.api), so the SDK, the CLI's RemoteBackend and the MCP server
find the daemon the same way and raise the same errors. Where the daemon is, first match wins: `url=` / `socket=`
arguments, `$FORKD_URL` (TCP, with `$FORKD_TOKEN`), the local daemon's unix socket ($FORKD_HOME/forkd.sock), else
upstream's default http://127.0.0.1:8889.

Failures are forkd.base.errors types (NotFound, Conflict, InvalidInput, Timeout, Unavailable, ...);
`ControllerError` is their base, under the SDK's older name: `e.status` is the HTTP code (None when the daemon
was not reached), `e.body` the parsed problem+json, `e.detail` its message, `e.hint` what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forkd.base.errors import ForkdError
from forkd.client.api import AsyncClient, Client
from forkd.client.http import Endpoint

ControllerError = ForkdError


class Controller(Client):
    """forkd.client.api.Client, also taking upstream's `base_url=` (a TCP URL) for `url=`."""

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0, *, at: Endpoint | None = None, base_url: str | None = None):
        super().__init__(url or base_url, token, socket, timeout, at=at)


class AsyncController(AsyncClient):
    """forkd.client.api.AsyncClient, also taking upstream's `base_url=`."""

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0, *, at: Endpoint | None = None, base_url: str | None = None):
        super().__init__(url or base_url, token, socket, timeout, at=at)

__all__ = ["AsyncController", "Controller", "ControllerError", "dumps"]


def dumps(obj: Any) -> str:
    """JSON of a result (models or plain data), for printing."""
    if isinstance(obj, list):
        return json.dumps([o.model_dump(mode="json") if hasattr(o, "model_dump") else o for o in obj])
    return json.dumps(obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj)
