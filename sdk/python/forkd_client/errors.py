"""The one hierarchy of forkd's errors, for the client and the runtime alike: the daemon raises these kinds, answers
them as problem+json with the HTTP status of their kind (`http_status`), and this client turns those answers back
into the same kinds (`api_error`), so a caller sees `NotFound` whether it ran forkd in-process or talked to a daemon.
The runtime re-exports them from forkd.base.errors (this module imports nothing of the runtime).

`e.message` says what went wrong, `e.hint` how to fix it; `e.status` is the HTTP code (None when the daemon was not
reached), `e.body` the parsed answer, `e.detail` its message, `e.url` the request. `exit_code` is what a command
line front end exits with: 1 = runtime failure, 2 = bad input, 3 = not found, 4 = conflict/not ready, 5 = timed
out, 6 = daemon unavailable."""

from __future__ import annotations

from typing import Any


class ForkdError(Exception):
    """An expected failure (the client never raises a raw httpx exception): `message`, and `hint` (optional)."""

    exit_code = 1
    http_status = 500  # what the daemon answers with for this kind

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None, body: Any = None,
                 url: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint
        self.status, self.body, self.url = status, body, url

    @property
    def detail(self) -> str:
        """The message, under problem+json's name for it."""
        return self.message

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class InvalidInput(ForkdError):
    """400/401/403/415/421/422: the request was refused as it stands."""

    exit_code = 2
    http_status = 400


class NotFound(ForkdError):
    """404: no such sandbox, snapshot, process or file."""

    exit_code = 3
    http_status = 404


class Conflict(ForkdError):
    """409: in use, already exists, or not ready."""

    exit_code = 4
    http_status = 409


class Timeout(ForkdError):
    """408/504: gave up waiting (for a child, an agent, the daemon; the operation may still run there)."""

    exit_code = 5
    http_status = 504


class Unavailable(ForkdError):
    """503, or the daemon (or another service forkd needs) cannot be reached (after the client's retries)."""

    exit_code = 6
    http_status = 503


class Busy(Unavailable):
    """429: too many calls in flight (into one child, or from one client); `retry_after` seconds, then again."""

    http_status = 429

    @property
    def retry_after(self) -> float | None:
        return self.body.get("retry_after") if isinstance(self.body, dict) else None


class ProtocolViolation(ForkdError):
    """502: a guest broke the agent protocol (a frame over the host's cap, malformed or misshapen JSON, a reply over
    its cap): the child misbehaved, so forkd stopped it and recorded why (a bad answer from upstream, never 500)."""

    http_status = 502


ControllerError = ForkdError  # the older SDK's name for the base class

ERRORS: dict[int, type[ForkdError]] = {
    400: InvalidInput, 401: InvalidInput, 403: InvalidInput, 404: NotFound, 408: Timeout, 409: Conflict,
    415: InvalidInput, 421: InvalidInput, 422: InvalidInput, 429: Busy,
    502: ProtocolViolation, 503: Unavailable, 504: Timeout,
}


def api_error(status: int, body: Any, url: str) -> ForkdError:
    """The error for a non-2xx answer (problem+json: `detail`, `hint`)."""
    detail = (body.get("detail") or body.get("error") or str(body)) if isinstance(body, dict) else str(body)
    if isinstance(detail, list):  # a 422 of FastAPI: the fields at fault
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg')}" for d in detail
                           if isinstance(d, dict)) or str(detail)
    hint = body.get("hint") if isinstance(body, dict) else None
    return ERRORS.get(status, ForkdError)(str(detail) or f"HTTP {status}", hint=hint, status=status, body=body,
                                          url=url)
