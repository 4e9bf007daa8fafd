"""Jobs: the long verbs (snapshot and image builds) run in the background, each answered at once as a job
(forkd_client.models.Job) that callers read, wait on or cancel.

A job goes queued -> running -> succeeded | failed | cancelled. At most `running` jobs run at once; the rest
wait queued, at most `queued` of them (Busy beyond: retry later). The newest `keep` finished jobs are kept, older
ones forgotten. Only a queued job can be cancelled: a running build is not interrupted (it runs to its end, then
its snapshot is the caller's to remove).

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
from forkd.base.errors import Busy, Conflict, ForkdError, NotFound, first_line
from forkd.base.private import ensure_private_dir
from forkd.service.wire import Job, JobError

log = logging.getLogger("forkd.jobs")

Progress = Callable[[str], None]
Work = Callable[[Progress], Any]  # the verb: called with a progress callback, answers JSON data
FINISHED = frozenset({"succeeded", "failed", "cancelled"})
ID = re.compile(r"^job-[0-9a-f]{16}$")
MAX_RECORD = 1 << 20  # bytes of one record read back from disk
LONGEST_POLL = 60.0  # seconds one `wait` may hold a caller
RESTARTED = "daemon restarted"


@dataclass(frozen=True)
class Limits:
    """How many jobs run at once, wait queued, and stay listed once finished."""

    running: int = 2
    queued: int = 16
    keep: int = 100


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
    """The jobs of one service, recorded under `root` (made private on first use)."""

    def __init__(self, root: Path, limits: Limits = Limits()):
        self.root, self.limits = Path(root), limits
        self._cond = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._work: dict[str, Work] = {}
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
        raise Conflict(f"job {job_id} {job.state}: {job.error.detail if job.error else ''}")

    def _changed(self, job_id: str, since: int | None) -> bool:
        job = self._jobs.get(job_id)  # None: finished and forgotten meanwhile
        return job is None or job.state in FINISHED or (since is not None and job.version > since)

    def _get(self, job_id: str) -> Job:
        self._load()
        job = self._jobs.get(job_id) if ID.match(job_id) else None
        if job is None:
            raise NotFound(f"no job {job_id!r}", hint="list them: GET /v1/jobs (finished ones are kept for the "
                                                      f"newest {self.limits.keep})")
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
        """A queued job cancelled; a finished one as it is; Conflict for a running one."""
        with self._cond:
            job = self._get(job_id)
            if job.state == "running":
                raise Conflict(f"job {job_id} ({job.kind} {job.target or ''}) is running: a running build is "
                               "not interrupted", hint="wait for it, then remove what it built (forkd rmi TAG)")
            if job.state == "queued":
                self._queue.remove(job_id)
                self._work.pop(job_id, None)
                self._finish(job, "cancelled")
            return self._jobs[job_id]

    def _start_next(self) -> None:
        """Under the lock: start queued jobs while fewer than `limits.running` run."""
        while self._queue and self._running < self.limits.running:
            job_id = self._queue.popleft()
            self._running += 1
            self._put(self._jobs[job_id].model_copy(update={"state": "running", "started_at": clock.wall()}))
            threading.Thread(target=self._run, args=(job_id,), name=f"forkd-{job_id}", daemon=True).start()

    def _run(self, job_id: str) -> None:
        work = self._work.pop(job_id)
        try:
            result = work(lambda line: self._phase(job_id, line))
        except BaseException as exc:  # noqa: BLE001 - every failure is the job's answer
            log.warning("job %s failed: %s", job_id, first_line(exc))
            with self._cond:
                self._raised[job_id] = exc
                self._finish(self._jobs[job_id], "failed", error=error_of(exc))
        else:
            with self._cond:
                self._finish(self._jobs[job_id], "succeeded", result=result)
        finally:
            with self._cond:
                self._running -= 1
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
