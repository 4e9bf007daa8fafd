"""The Python SDK, under the runtime's name: a re-export of the light client forkd-client (sdk/python, import
`forkd_client`: httpx and pydantic only), so `forkd.sdk` and `forkd_client` are one SDK with one behaviour.

    from forkd.sdk import Controller, Sandbox      # the same objects as forkd_client's
    ctrl = Controller()                            # FORKD_URL + FORKD_TOKEN, or the local unix socket
    [sb] = ctrl.spawn_sandboxes("base", n=1)
    print(ctrl.exec_command(sb.id, ["echo", "hi"]).stdout)
    with Sandbox.create(template="base") as sb: ...

`Controller`/`AsyncController` are forkd_client's Client/AsyncClient (upstream's method names; `base_url=` works;
retries on connect errors and 503); results are forkd_client.models; `sb.commands` streams (forkd_client.commands),
`sb.files` is the full filesystem (forkd_client.files). Failures are ControllerError (= ForkdError, the same
classes as forkd.base.errors), raised as their kinds: NotFound, Conflict, InvalidInput, Timeout, Unavailable,
ProtocolViolation.
"""

from forkd_client import (
    AsyncClient,
    AsyncController,
    AsyncSandbox,
    BranchResult,
    Client,
    CommandHandle,
    CommandResult,
    Conflict,
    Controller,
    ControllerError,
    EntryInfo,
    EvalResult,
    ExecResult,
    ForkdError,
    InvalidInput,
    NotFound,
    PingResult,
    ProtocolViolation,
    Sandbox,
    SandboxInfo,
    SnapshotDetail,
    SnapshotInfo,
    Timeout,
    Unavailable,
    WatchEvent,
)

__all__ = ["AsyncClient", "AsyncController", "AsyncSandbox", "BranchResult", "Client", "CommandHandle",
           "CommandResult", "Conflict", "Controller", "ControllerError", "EntryInfo", "EvalResult", "ExecResult",
           "ForkdError", "InvalidInput", "NotFound", "PingResult", "ProtocolViolation", "Sandbox", "SandboxInfo",
           "SnapshotDetail", "SnapshotInfo", "Timeout", "Unavailable", "WatchEvent"]
