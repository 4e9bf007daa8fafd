"""forkd-client: the light Python client of a running forkd daemon (httpx and pydantic only; never imports the
`forkd` runtime). Sync and async; errors by kind (forkd_client.errors); retries on connect errors and 503
(forkd_client.http); an E2B-style `Sandbox` with streaming commands; upstream's API in forkd_client.compat.

    from forkd_client import Sandbox
    with Sandbox.create(template="base") as sb:
        print(sb.commands.run("echo hi", on_stdout=print).stdout)
"""

from forkd_client.api import AsyncClient, Client
from forkd_client.commands import CommandHandle, CommandResult
from forkd_client.errors import (
    Conflict,
    ControllerError,
    ForkdError,
    InvalidInput,
    NotFound,
    ProtocolViolation,
    Timeout,
    Unavailable,
)
from forkd_client.http import Endpoint, Retry
from forkd_client.models import (
    BranchResult,
    EvalResult,
    ExecResult,
    FileWritten,
    PingResult,
    SandboxInfo,
    SnapshotDetail,
    SnapshotInfo,
)
from forkd_client.sandbox import AsyncSandbox, Sandbox

AsyncController, Controller = AsyncClient, Client  # upstream's names for the clients

__all__ = ["AsyncClient", "AsyncController", "AsyncSandbox", "BranchResult", "Client", "CommandHandle",
           "CommandResult", "Conflict", "Controller", "ControllerError", "Endpoint", "EvalResult", "ExecResult",
           "FileWritten", "ForkdError", "InvalidInput", "NotFound", "PingResult", "ProtocolViolation", "Retry",
           "Sandbox", "SandboxInfo", "SnapshotDetail", "SnapshotInfo", "Timeout", "Unavailable"]
