"""Python SDK for a running forkd daemon (`forkd serve`): upstream-compatible `Controller`, E2B-style `Sandbox`,
and their async variants. Results are the pydantic wire models the daemon itself uses (forkd.client.wire).

    from forkd.sdk import Controller, Sandbox
    ctrl = Controller()                       # FORKD_URL + FORKD_TOKEN, or the local unix socket
    [sb] = ctrl.spawn_sandboxes("base", n=1)
    print(ctrl.exec_command(sb.id, ["echo", "hi"]).stdout)

Failures are ControllerError (forkd.base.errors.ForkdError), raised as its kinds: NotFound, Conflict, InvalidInput,
Timeout, Unavailable, ProtocolViolation (exported here too). Outside the runtime, use the light client of the same
surface: `pip install sdk/python` (distribution forkd-client, import forkd_client: httpx and pydantic only).
"""

from forkd.base.errors import Conflict, InvalidInput, NotFound, ProtocolViolation, Timeout, Unavailable
from forkd.client.wire import (
    BranchResult,
    EvalResult,
    ExecResult,
    PingResult,
    SandboxInfo,
    SnapshotDetail,
    SnapshotInfo,
)
from forkd.sdk.controller import AsyncController, Controller, ControllerError
from forkd.sdk.sandbox import AsyncSandbox, Sandbox

__all__ = ["AsyncController", "AsyncSandbox", "BranchResult", "Conflict", "Controller", "ControllerError", "EvalResult",
           "ExecResult", "InvalidInput", "NotFound", "PingResult", "ProtocolViolation", "Sandbox", "SandboxInfo",
           "SnapshotDetail", "SnapshotInfo", "Timeout", "Unavailable"]
