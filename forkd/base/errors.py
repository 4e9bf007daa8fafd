"""The exception types forkd raises for expected failures, each with a hint that says how to fix it.

One hierarchy for every front end and the light client: the kinds every caller sees (ForkdError, InvalidInput,
NotFound, Conflict, Timeout, Unavailable, ProtocolViolation, with their `exit_code` and `http_status`) live in
forkd_client.errors (the forkd-client distribution, a dependency of the runtime) and are re-exported here, the same
class objects: the core raises them, the daemon turns them into problem+json with the HTTP status of their kind,
and the HTTP client turns those answers back into the same types, so `except NotFound` catches a NotFound whether
the core ran in-process or a daemon answered. What only the runtime raises or needs is defined here.
"""

from __future__ import annotations

from forkd_client.errors import (
    Busy,
    Conflict,
    ControllerError,
    ForkdError,
    InvalidInput,
    NotFound,
    ProtocolViolation,
    Timeout,
    Unavailable,
)

__all__ = ["Busy", "Conflict", "ControllerError", "ForkdError", "InvalidInput", "NotFound", "ProtocolViolation",
           "TerminalError", "Timeout", "Unavailable", "first_line"]


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none): for statuses and manifests."""
    s = str(exc)
    return s.splitlines()[0] if s else type(exc).__name__


class TerminalError(ForkdError):
    """A failure that retrying cannot fix: the spec (or what it names) has to change first. The reconciler records
    it and does not retry the action until then; every other exception is retried with back-off
    (controller-runtime's model)."""
