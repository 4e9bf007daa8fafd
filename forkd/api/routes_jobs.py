"""Job routes: the builds running on this daemon (forkd.service.jobs), each a job resource.

  GET /v1/jobs          the jobs kept, newest first
  GET /v1/jobs/{id}     one job; `wait_secs` holds the answer until the job changes past `since` or finishes
  DELETE /v1/jobs/{id}  cancel a queued or running job (409 once it is finished, naming its state)
"""

from __future__ import annotations

from fastapi import APIRouter, Query

from forkd.service import Service, wire
from forkd.service.jobs import LONGEST_POLL


def build_jobs_router(s: Service) -> APIRouter:
    r = APIRouter(tags=["jobs"])

    @r.get("/v1/jobs")
    def jobs() -> list[wire.Job]:
        """Every job this daemon keeps (the running, the queued and the newest finished ones), newest first."""
        return s.jobs.list()

    @r.get("/v1/jobs/{id}")
    def job(id: str, wait_secs: float = Query(0.0, ge=0, le=LONGEST_POLL, description=(
                "hold the answer up to this long, until the job's `version` is past `since` (without `since`: "
                "until it is finished)")),
            since: int | None = Query(None, ge=0, description="the `version` the caller has seen")) -> wire.Job:
        """One job: `state` queued, running, succeeded (`result`: what the blocking call answers), failed (`error`:
        the status, kind, detail and hint the blocking call would have answered) or cancelled."""
        return s.jobs.wait(id, wait_secs, since) if wait_secs else s.jobs.get(id)

    @r.delete("/v1/jobs/{id}")
    def cancel(id: str) -> wire.Job:
        """Cancel a queued or running job (409 for a finished one, naming its state; 404 for an unknown one).

        A queued job answers `cancelled`; a running one answers still `running`, phase `cancelling`: its build
        stops at its next check (its VMM is stopped now) and removes what it was writing, then the job is
        `cancelled` (wait for it: GET with `wait_secs`). A step that does not wait on the VMM (a host tool, copying
        and hashing memory) finishes first, and a build already past its last check ends `succeeded`."""
        return s.jobs.cancel(id)

    return r
