"""Waiting on a job (forkd_client.models.Job), the daemon's answer to a long verb such as a snapshot build: poll
`GET /v1/jobs/{id}` with a long poll (the daemon answers as soon as the job changes, else after `POLL_SECS`) until
it is finished, then its result, or the error it failed with raised as the kind the blocking call raised."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from forkd_client.errors import Conflict, Timeout, api_error
from forkd_client.models import Job

POLL_SECS = 30.0  # one long poll; the HTTP timeout of a call must be longer

Phase = Callable[[str], None]


def submitted(data: Any) -> Job:
    """The job a 202 answered; a daemon older than jobs answers the finished call itself: a succeeded job of it."""
    if isinstance(data, dict) and "state" in data and "kind" in data:
        return Job.model_validate(data)
    return Job(id="", kind="blocking", state="succeeded", result=data)


def outcome(job: Job, url: str = "") -> Any:
    """A finished job's result; a failed one's error raised as its kind (NotFound, Conflict, Timeout...)."""
    if job.state == "succeeded":
        return job.result
    if job.state == "cancelled":
        raise Conflict(f"job {job.id} ({job.kind} {job.target or ''}) was cancelled",
                       hint="submit it again")
    if job.error is None:
        raise Conflict(f"job {job.id} is {job.state}, not finished", hint="wait for it (GET /v1/jobs/{id})")
    return _raise(job, url)


def _raise(job: Job, url: str) -> Any:
    raise api_error(job.error.status, job.error.model_dump(), url or f"/v1/jobs/{job.id}")


class Waiting:
    """One wait: its deadline and the phase lines already reported."""

    def __init__(self, job: Job, timeout: float | None, on_phase: Phase | None):
        self.job, self.on_phase = job, on_phase
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._said = None
        self.saw(job)

    def saw(self, job: Job) -> None:
        self.job = job
        if self.on_phase and job.phase and job.phase != self._said:
            self._said = job.phase
            self.on_phase(job.phase)

    def next_poll(self) -> float:
        """Seconds the next long poll may wait; Timeout once the deadline has passed (the job keeps running)."""
        if self.deadline is None:
            return POLL_SECS
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Timeout(f"job {self.job.id} ({self.job.kind} {self.job.target or ''}) is still "
                          f"{self.job.state} ({self.job.phase or 'no progress reported'})",
                          hint=f"it keeps running on the daemon: GET /v1/jobs/{self.job.id}, or wait longer")
        return min(POLL_SECS, max(left, 0.1))


def wait(client: Any, job: Job, timeout: float | None = None, on_phase: Phase | None = None) -> Job:
    """Block until `job` is finished (a `Client`'s calls); `on_phase` gets each new progress line."""
    w = Waiting(job, timeout, on_phase)
    while not w.job.done:
        w.saw(client.get_job(job.id, wait_secs=w.next_poll(), since=w.job.version))
    return w.job


async def wait_async(client: Any, job: Job, timeout: float | None = None, on_phase: Phase | None = None) -> Job:
    """`wait` with an `AsyncClient`."""
    w = Waiting(job, timeout, on_phase)
    while not w.job.done:
        w.saw(await client.get_job(job.id, wait_secs=w.next_poll(), since=w.job.version))
    return w.job
