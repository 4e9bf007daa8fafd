"""Jobs: the long verbs (snapshot and image builds) run in the background, each answered at once as a job
(forkd_client.models.Job) that callers read, wait on or cancel.

A job goes queued -> running -> succeeded | failed | cancelled. At most `running` jobs run at once; the rest
wait queued, at most `queued` of them (Busy beyond: retry later). The newest `keep` finished jobs are kept, older
ones forgotten. The three are settings (FORKD_JOBS_RUNNING, FORKD_JOBS_QUEUED, FORKD_JOBS_KEPT), read once when
the table is made (`Limits.from_settings`).

Cancelling: a queued job ends `cancelled` at once. A running one is cancelled cooperatively, never by raising
into its thread: its work gets a cancel token (forkd.base.cancel) with its progress callback; `cancel` sets the
token, and the job stays `running` (phase "cancelling") until the work has unwound, then ends `cancelled`. The
work stops at its next progress line (the callback checks the token) and, for a snapshot build, between its steps,
where setting the token also stops the build's VMM through the driver, ending a step that waits on the guest;
what it was writing is removed on the way out (forkd.core.pipeline.job: the snapshot it began; an image build's
work directory). A cancel cannot interrupt a step blocked elsewhere (a syscall, a host tool such as mmdebstrap or
skopeo, a boot still waiting for its guest, copying and hashing a memory file): that step finishes first. A build
that gets past its last check (a snapshot's commit) finishes as if never cancelled: `succeeded`. Cancelling a
finished job is a Conflict naming its state.

Each job is a record `<jobs dir>/<id>.json`, written whole (forkd.base.atomic) at every change of state, so a job
outlives the process that ran it as a finished record. A daemon that stops mid-job cannot finish it: the next
daemon's start (`recover`) marks every job left queued or running failed, "daemon restarted", never running;
the snapshot it was writing is the store's recovery's (a writer that died leaves it failed).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkd.base import clock
from forkd.base.atomic import write_json
from forkd.base.cancel import CancelToken, checking
from forkd.base.errors import Busy, Conflict, ForkdError, NotFound, first_line
from forkd.base.private import ensure_private_dir
from forkd.base.settings import settings
from forkd.service.wire import Job, JobError

log = logging.getLogger("forkd.jobs")

Progress = Callable[[str], None]
Work = Callable[[Progress, CancelToken], Any]  # the verb: called with its progress callback and cancel token,
# answers JSON data
FINISHED = frozenset({"succeeded", "failed", "cancelled"})
ID = re.compile(r"^job-[0-9a-f]{16}$")
MAX_RECORD = 1 << 20  # bytes of one record read back from disk
LONGEST_POLL = 60.0  # seconds one `wait` may hold a caller
RESTARTED = "daemon restarted"


@dataclass(frozen=True)
class Limits:
    """How many jobs run at once, wait queued, and stay listed once finished."""

    running: int
    queued: int
    keep: int

    @classmethod
    def from_settings(cls) -> Limits:
        """FORKD_JOBS_RUNNING, FORKD_JOBS_QUEUED and FORKD_JOBS_KEPT (bounded there: InvalidInput names a bad one)."""
        s = settings()
        return cls(running=s.jobs_running, queued=s.jobs_queued, keep=s.jobs_kept)


def error_of(exc: BaseException) -> JobError:
    """What a failed job says: the HTTP status and kind the blocking call would have answered, and its hint."""
    if isinstance(exc, ForkdError):
        return JobError(status=exc.http_status, type=type(exc).__name__, detail=exc.message or first_line(exc),
                        hint=exc.hint)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return JobError(status=503, type="Unavailable", detail=f"{exc.strerror}: {exc.filename or 'a file'}",
                        hint="free space on that filesystem (see 'df'), then submit the job again")
    return JobError(status=500, type="InternalError", detail=f"{type(exc).__name__}: {exc}")


class Jobs:
    """The jobs of one service, recorded under `root` (made private on first use); `limits` default to the
    settings, read now."""

    def __init__(self, root: Path, limits: Limits | None = None):
        self.root, self.limits = Path(root), limits or Limits.from_settings()
        self._cond = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._work: dict[str, Work] = {}
        self._tokens: dict[str, CancelToken] = {}  # the running jobs' cancel tokens
        self._raised: dict[str, BaseException] = {}  # failed here: the exception itself, for a blocking caller
        self._mine: set[str] = set()  # submitted to this service
        self._queue: deque[str] = deque()
        self._running = 0
        self._loaded = False

    # -- reading ---------------------------------------------------------------------------------------
    def list(self) -> list[Job]:
        """Every job kept, newest first."""
        with self._cond:
            self._load()
            return sorted(self._jobs.values(), key=lambda j: (j.created_at, j.id), reverse=True)

    def get(self, job_id: str) -> Job:
        with self._cond:
            return self._get(job_id)

    def wait(self, job_id: str, timeout: float, since: int | None = None) -> Job:
        """The job once its version is past `since` (None: once it is finished), or as it is after `timeout`
        seconds (at most LONGEST_POLL)."""
        with self._cond:
            self._get(job_id)
            self._cond.wait_for(lambda: self._changed(job_id, since), min(max(timeout, 0.0), LONGEST_POLL))
            return self._get(job_id)

    def outcome(self, job_id: str) -> Any:
        """Wait for the job to finish: its result, or the very exception it failed with."""
        with self._cond:
            self._cond.wait_for(lambda: self._changed(job_id, None))
            job = self._get(job_id)
            if job.state == "succeeded":
                return job.result
            if job_id in self._raised:
                raise self._raised[job_id]
        raise Conflict(f"job {job_id} ({_what(job)}) {job.state}{': ' + job.error.detail if job.error else ''}")

    def _changed(self, job_id: str, since: int | None) -> bool:
        job = self._jobs.get(job_id)  # None: finished and forgotten meanwhile
        return job is None or job.state in FINISHED or (since is not None and job.version > since)

    def _get(self, job_id: str) -> Job:
        self._load()
        job = self._jobs.get(job_id) if ID.match(job_id) else None
        if job is None:
            raise NotFound(f"no job {job_id!r}", hint="list them: forkd job ls, GET /v1/jobs (finished "
                                                      f"ones are kept for the newest {self.limits.keep})")
        return job

    # -- running ---------------------------------------------------------------------------------------
    def submit(self, kind: str, work: Work, target: str | None = None) -> Job:
        """Queue `work`; it starts at once when fewer than `limits.running` run. Busy when the queue is full."""
        with self._cond:
            self._load()
            if self._running >= self.limits.running and len(self._queue) >= self.limits.queued:
                raise Busy(f"{self._running} builds are running and {len(self._queue)} are queued, the most "
                           f"this daemon takes", hint="retry when one has finished (GET /v1/jobs)")
            job = Job(id=f"job-{secrets.token_hex(8)}", kind=kind, state="queued", target=target,
                      created_at=clock.wall())
            self._work[job.id] = work
            self._mine.add(job.id)
            self._put(job)
            self._queue.append(job.id)
            self._start_next()
            return self._jobs[job.id]

    def cancel(self, job_id: str) -> Job:
        """Cancel a job: a queued one is answered `cancelled`; a running one is asked to stop and answered still
        `running`, phase "cancelling" (it ends `cancelled` once its work has unwound: wait on it); Conflict naming
        the state of a finished one, or of one another process runs."""
        with self._cond:
            job = self._get(job_id)
            if job.state in FINISHED:
                raise Conflict(f"job {job_id} ({_what(job)}) is {job.state}: only a queued or running job can be "
                               "cancelled", hint=f"its outcome: forkd job ls, GET /v1/jobs/{job_id}")
            if job_id not in self._mine:
                raise Conflict(f"job {job_id} ({_what(job)}) is {job.state} in another process, which alone can "
                               "cancel it", hint="cancel it through the daemon that runs it; a daemon's start "
                                                 "fails the jobs a stopped one left")
            if job.state == "queued":
                self._queue.remove(job_id)
                self._work.pop(job_id, None)
                self._finish(job, "cancelled")
                return self._jobs[job_id]
            token = self._tokens[job_id]
            if not token.cancelled:
                self._put(job.model_copy(update={"phase": "cancelling"}), durable=False)
        token.cancel(f"job {job_id} was cancelled")  # outside the lock: its hooks stop the build's VMM
        with self._cond:
            return self._jobs[job_id]

    def _start_next(self) -> None:
        """Under the lock: start queued jobs while fewer than `limits.running` run."""
        while self._queue and self._running < self.limits.running:
            job_id = self._queue.popleft()
            self._running += 1
            self._tokens[job_id] = CancelToken()
            self._put(self._jobs[job_id].model_copy(update={"state": "running", "started_at": clock.wall()}))
            threading.Thread(target=self._run, args=(job_id,), name=f"forkd-{job_id}", daemon=True).start()

    def _run(self, job_id: str) -> None:
        work, token = self._work.pop(job_id), self._tokens[job_id]
        try:
            result = work(checking(lambda line: self._phase(job_id, line), token), token)
        except BaseException as exc:  # noqa: BLE001 - every failure is the job's answer
            with self._cond:
                if token.cancelled:  # whatever the unwinding raised: the caller's cancel ended it
                    log.info("job %s cancelled (%s)", job_id, first_line(exc))
                    self._finish(self._jobs[job_id], "cancelled")
                else:
                    log.warning("job %s failed: %s", job_id, first_line(exc))
                    self._raised[job_id] = exc
                    self._finish(self._jobs[job_id], "failed", error=error_of(exc))
        else:
            with self._cond:  # a cancel that came after the work's last check was too late: it succeeded
                self._finish(self._jobs[job_id], "succeeded", result=result)
        finally:
            with self._cond:
                self._running -= 1
                self._tokens.pop(job_id, None)
                self._start_next()

    def _phase(self, job_id: str, line: str) -> None:
        with self._cond:
            job = self._jobs[job_id]
            self._put(job.model_copy(update={"phase": line[:500]}), durable=False)

    def _finish(self, job: Job, state: str, **update: Any) -> None:
        self._put(job.model_copy(update={"state": state, "finished_at": clock.wall(), **update}))
        self._forget_oldest()

    def _forget_oldest(self) -> None:
        done = sorted((j for j in self._jobs.values() if j.state in FINISHED), key=lambda j: (j.finished_at or 0,
                                                                                            j.created_at))
        for old in done[:max(0, len(done) - self.limits.keep)]:
            del self._jobs[old.id]
            self._raised.pop(old.id, None)
            self._mine.discard(old.id)
            (self.root / f"{old.id}.json").unlink(missing_ok=True)

    # -- records ---------------------------------------------------------------------------------------
    def _put(self, job: Job, durable: bool = True) -> None:
        """Under the lock: the job's new state, in memory and on disk, and everyone waiting woken."""
        job = job.model_copy(update={"version": job.version + 1})
        self._jobs[job.id] = job
        write_json(self.root / f"{job.id}.json", job.model_dump(mode="json"), mode=0o600, durable=durable)
        self._cond.notify_all()

    def _load(self) -> None:
        """Under the lock, once: the records earlier services left (finished ones; `recover` ends the rest)."""
        if self._loaded:
            return
        ensure_private_dir(self.root)
        for job in _read_records(self.root):
            self._jobs.setdefault(job.id, job)
        self._loaded = True
        self._forget_oldest()

    def recover(self) -> list[str]:
        """At a daemon's start (the home lock held: no other service runs jobs on this home): every job an
        earlier service left queued or running is failed, "daemon restarted". Their ids."""
        with self._cond:
            self._load()
            left = [j for j in self._jobs.values() if j.state not in FINISHED and j.id not in self._mine]
            for job in left:
                self._finish(job, "failed", error=JobError(
                    status=503, type="Unavailable", detail=f"{RESTARTED}: the job was {job.state} when the "
                    "daemon that ran it stopped", hint="submit it again (a snapshot it was writing is failed: "
                                                       "remove it with forkd rmi TAG)"))
            return [j.id for j in left]


def _what(job: Job) -> str:
    """A job as its messages name it: its kind and target."""
    return f"{job.kind} {job.target}" if job.target else job.kind


def _read_records(root: Path) -> list[Job]:
    """The job records in `root`: regular files only (never a link), each bounded and validated; a record that
    cannot be read is skipped and logged."""
    jobs = []
    for path in root.glob("job-*.json"):
        if not ID.match(path.stem):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                    data = f.read(MAX_RECORD + 1)
            if len(data) > MAX_RECORD:
                raise ValueError(f"longer than {MAX_RECORD} bytes")
            jobs.append(Job.model_validate(json.loads(data)))
        except (OSError, ValueError) as exc:
            log.warning("job record %s skipped: %s", path, first_line(exc))
    return jobs
