"""BRANCH, as callers know it: `branch(rt, Branch)`, its result, and waiting for background conversions.

The capture is decided as data before anything is written or paused: the source is looked up once
(forkd.core.pipeline.branch.source_of), probed where a live branch may be taken by pages
(forkd.core.pipeline.branch_paged.probe_source), and `plan_branch` (forkd.core.pipeline.branch_plan, pure) says
which capture runs; one BranchJob carries it out with that capture's steps (`WAYS`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from forkd.base.errors import Conflict
from forkd.base.settings import settings
from forkd.core.pipeline.branch import BranchJob, BranchResult, Streamed, Way
from forkd.core.pipeline.branch_diff import ByPages
from forkd.core.pipeline.branch_paged import probe_source
from forkd.core.pipeline.branch_plan import Probe, needs_probe, plan_branch
from forkd.core.pipeline.branch_source import source_of
from forkd.core.requests import Branch

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

__all__ = ["BranchResult", "branch", "wait_background"]
log = logging.getLogger("forkd.branch")

# a strategy's capture -> its part of the job (given the probe, if one was taken)
WAYS: dict[str, Callable[[Probe | None], Way]] = {
    "pages": lambda probe: ByPages(layer=False, written=probe.written_pages if probe else None),
    "diff": lambda probe: ByPages(layer=True),
    "write-protect": lambda probe: Streamed(),
    "stop": lambda probe: Streamed(),
}


def wait_background(rt: Runtime, timeout: float | None = None) -> None:
    """Wait for the background conversions (wait=False branches) `rt` started in this process to end."""
    rt.conversions.wait(timeout)


def branch(rt: Runtime, req: Branch) -> BranchResult:
    """Snapshot the running child `req.child_id` as `req.tag`. See forkd.core.pipeline.branch.

    `req.tmp_dir` (default $FORKD_HOME/tmp) holds the transient files (live and full: the whole RAM stream; diff:
    the pages the child wrote). `req.labels` are added to the new snapshot's (the source snapshot's labels are
    not inherited: they say who owns *that* snapshot). A live branch is taken by pages when it can
    (forkd.core.pipeline.branch_paged), else by the VMM's write-protect capture; the result says which."""
    live_capture = settings().branch_live_capture
    src = source_of(rt, req.child_id)
    probe = probe_source(rt, src) if needs_probe(req.mode, live_capture) else None
    plan = plan_branch(req.child_id, req.mode, live_capture, probe)
    if plan.refusal is not None:
        raise Conflict(plan.refusal[0], hint=plan.refusal[1])
    if plan.not_paged:
        log.info("branch %r of child %s: the VMM's write-protect capture, not pages: %s", req.tag, req.child_id,
                 plan.not_paged)
    return BranchJob(rt, req, plan, src, WAYS[plan.capture](probe)).start()

