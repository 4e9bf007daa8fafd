"""forkd-client: the light Python client of a running forkd daemon (httpx and pydantic only; never imports the
`forkd` runtime). Sync and async; errors by kind (forkd_client.errors, the same classes the runtime raises);
retries on connect errors and 503 (forkd_client.http); an E2B-style `Sandbox` with streaming commands, a full
filesystem (forkd_client.files), timeouts, metadata and fork(n); upstream's API in forkd_client.compat.

    from forkd_client import Sandbox
    with Sandbox.create(template="base") as sb:
        print(sb.commands.run("echo hi", on_stdout=print).stdout)

The names below are loaded on first use, so `import forkd_client.errors` (what the runtime's forkd.base.errors
does) loads neither httpx nor pydantic.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "AsyncClient": "api", "Client": "api",
    "CommandHandle": "commands", "CommandResult": "commands", "CommandExitException": "commands",
    "TimeoutException": "commands",
    "Busy": "errors", "Conflict": "errors", "ControllerError": "errors", "ForkdError": "errors",
    "InvalidInput": "errors",
    "NotFound": "errors", "ProtocolViolation": "errors", "Timeout": "errors", "Unavailable": "errors",
    "Endpoint": "http", "Retry": "http",
    "BranchResult": "models", "EvalResult": "models", "Job": "models", "ExecResult": "models", "FileWritten": "models",
    "PingResult": "models", "PortGrant": "models", "PortGrantInfo": "models",
    "SandboxInfo": "models", "SnapshotDetail": "models", "SnapshotInfo": "models",
    "EntryInfo": "files", "Filesystem": "files", "AsyncFilesystem": "files", "WatchEvent": "files",
    "WatchHandle": "files",
    "AsyncSandbox": "sandbox", "Sandbox": "sandbox",
}
_ALIASES = {"AsyncController": "AsyncClient", "Controller": "Client",  # upstream's names for the clients
            "SandboxException": "ForkdError"}  # E2B's name for the base class

__all__ = sorted([*_WHERE, *_ALIASES])


def __getattr__(name: str) -> Any:
    real = _ALIASES.get(name, name)
    if real not in _WHERE:
        raise AttributeError(f"module 'forkd_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"forkd_client.{_WHERE[real]}"), real)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
