"""The exception types forkd raises for expected failures, each with a hint that says how to fix it.

One hierarchy for every front end: the core raises them, the daemon turns them into problem+json with the HTTP
status of their kind, and the HTTP client (forkd.client.http) turns those answers back into the same types, so a
caller sees `NotFound` whether it ran the core in-process or talked to a daemon.
"""

from __future__ import annotations

from typing import Any


class ForkdError(Exception):
    """An expected failure: `message` says what went wrong, `hint` (optional) how to fix it.

    `exit_code` lets front ends map failures to scripted exit codes (1 = runtime failure, 2 = bad input,
    3 = not found, 4 = conflict/not ready, 5 = timed out, 6 = daemon unavailable). Errors that came back from a
    daemon also carry the HTTP `status`, the parsed problem `body` and the request `url`.
    """

    exit_code = 1
    http_status = 500  # what the daemon answers with for this kind

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None, body: Any = None,
                 url: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.status, self.body, self.url = status, body, url

    @property
    def detail(self) -> str:
        """The message, under problem+json's name for it."""
        return self.message

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class InvalidInput(ForkdError):
    exit_code = 2
    http_status = 400


class NotFound(ForkdError):
    exit_code = 3
    http_status = 404


class Conflict(ForkdError):
    exit_code = 4
    http_status = 409


class Timeout(ForkdError):
    """Gave up waiting (for a child, an agent, the daemon)."""

    exit_code = 5
    http_status = 504


class Unavailable(ForkdError):
    """The daemon (or another service forkd needs) cannot be reached."""

    exit_code = 6
    http_status = 503


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none): for statuses and manifests."""
    s = str(exc)
    return s.splitlines()[0] if s else type(exc).__name__


class TerminalError(ForkdError):
    """A failure that retrying cannot fix: the spec (or what it names) has to change first. The reconciler records
    it and does not retry the action until then; every other exception is retried with back-off
    (controller-runtime's model)."""


class ProtocolViolation(ForkdError):
    """A guest broke the agent protocol (a frame over the host's cap, malformed or misshapen JSON, a reply over its
    cap): the child misbehaved, so forkd stops it and records why. The daemon answers 502 (a bad answer from
    upstream), never 500."""

    http_status = 502
