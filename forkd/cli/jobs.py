"""`forkd job ls|cancel`: the builds the daemon runs as jobs (docs/jobs.md). Parsing and printing only: the work
is the backend's (forkd.client)."""

from __future__ import annotations

from typing import Any

import typer

from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, emit

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")
FINISHED = ("succeeded", "failed", "cancelled")
POLL = 30.0  # seconds of one long poll while waiting for a cancelled build to unwind
COLUMNS = [("JOB", "left"), ("KIND", "left"), ("TARGET", "left"), ("STATE", "left"), ("PHASE", "left")]

job_app = typer.Typer(help="Builds running on the daemon as jobs: ls, cancel.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(job_app, name="job")


def _row(j: dict[str, Any]) -> list[str]:
    said = (j.get("error") or {}).get("detail") if j["state"] == "failed" else j.get("phase")
    return [j["id"], j["kind"], j.get("target") or "-", j["state"], said or "-"]


@job_app.command("ls")
def job_ls(output: Fmt = OUTPUT) -> None:
    """List the jobs the daemon keeps (running, queued and the newest finished ones), newest first."""
    jobs = backend().jobs()
    emit(jobs, output, COLUMNS, [_row(j) for j in jobs])


@job_app.command("cancel")
def job_cancel(job_id: str = typer.Argument(..., metavar="ID", help="the job (forkd job ls)"),
               wait: bool = typer.Option(True, "--wait/--no-wait", help="wait until a running build has stopped "
                                         "and removed what it was writing (it is `cancelled` then)"),
               output: Fmt = OUTPUT) -> None:
    """Cancel a queued or running build: a running one stops at its next step (its VMM is stopped at once) and
    removes the snapshot it was writing. Exits 4 (conflict) for a finished job, naming its state."""
    b = backend()
    job = b.cancel_job(job_id)
    while wait and job["state"] not in FINISHED:
        job = b.job(job_id, wait_secs=POLL, since=job["version"])
    emit(job, output, COLUMNS, [_row(job)])
