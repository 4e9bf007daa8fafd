"""The one exception type forkd raises for expected failures, with a hint that says how to fix it."""

from __future__ import annotations


class ForkdError(Exception):
    """An expected failure: `message` says what went wrong, `hint` (optional) how to fix it.

    `exit_code` lets front ends map failures to scripted exit codes (2 = bad input, 1 = runtime failure,
    3 = not found, 4 = conflict/not ready).
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class InvalidInput(ForkdError):
    exit_code = 2


class NotFound(ForkdError):
    exit_code = 3


class Conflict(ForkdError):
    exit_code = 4


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none): for statuses and manifests."""
    s = str(exc)
    return s.splitlines()[0] if s else type(exc).__name__


class TerminalError(ForkdError):
    """A failure that retrying cannot fix: the spec (or what it names) has to change first. The reconciler records
    it and does not retry the action until then; every other exception is retried with back-off
    (controller-runtime's model)."""
