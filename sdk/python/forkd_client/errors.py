"""The client's errors: the same kinds (and names) as the daemon's forkd.base.errors, rebuilt from its problem+json
answers, without importing the runtime. `e.status` is the HTTP code (None when the daemon was not reached),
`e.body` the parsed answer, `e.detail` its message, `e.hint` what to do, `e.url` the request."""

from __future__ import annotations

from typing import Any


class ForkdError(Exception):
    """Every failure the client raises (never a raw httpx exception)."""

    def __init__(self, message: str, hint: str | None = None, *, status: int | None = None, body: Any = None,
                 url: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint
        self.status, self.body, self.url = status, body, url

    @property
    def detail(self) -> str:
        return self.message

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class InvalidInput(ForkdError):
    """400/401/403/415/421/422: the request was refused as it stands."""


class NotFound(ForkdError):
    """404: no such sandbox, snapshot, process or file."""


class Conflict(ForkdError):
    """409: in use, already exists, or not ready."""


class Timeout(ForkdError):
    """408/504, or the daemon did not answer in time (the operation may still run there)."""


class Unavailable(ForkdError):
    """503, or the daemon cannot be reached (after the client's retries)."""


class ProtocolViolation(ForkdError):
    """502: a child broke the agent protocol; the daemon stopped it."""


ControllerError = ForkdError  # the older SDK's name for the base class

ERRORS: dict[int, type[ForkdError]] = {
    400: InvalidInput, 401: InvalidInput, 403: InvalidInput, 404: NotFound, 408: Timeout, 409: Conflict,
    415: InvalidInput, 421: InvalidInput, 422: InvalidInput, 502: ProtocolViolation, 503: Unavailable, 504: Timeout,
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
