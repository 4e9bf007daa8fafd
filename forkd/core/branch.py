"""BRANCH, as callers know it: `branch(rt, Branch)`, its result, and waiting for background conversions.
The handlers are forkd.core.pipeline.branch (modes live and full), forkd.core.pipeline.branch_diff (diff) and
forkd.core.pipeline.branch_paged (live, by the pages the source wrote, tried first)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from forkd.base.errors import Conflict
from forkd.base.settings import settings
from forkd.core.pipeline.branch import BranchJob, BranchResult, wait_background
from forkd.core.pipeline.branch_diff import DiffBranchJob
from forkd.core.pipeline.branch_paged import NotPaged, PagedBranchJob
from forkd.core.requests import Branch

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

__all__ = ["BranchResult", "branch", "wait_background"]
log = logging.getLogger("forkd.branch")


def branch(rt: Runtime, req: Branch) -> BranchResult:
    """Snapshot the running child `req.child_id` as `req.tag`. See forkd.core.pipeline.branch.

    `req.tmp_dir` (default $FORKD_HOME/tmp) holds the transient files (live and full: the whole RAM stream; diff:
    the pages the child wrote). `req.labels` are added to the new snapshot's (the source snapshot's labels are
    not inherited: they say who owns *that* snapshot). A live branch is taken by pages when it can
    (forkd.core.pipeline.branch_paged), else by the VMM's write-protect capture; the result says which."""
    if req.mode == "diff":
        return DiffBranchJob(rt, req).start()
    note = None
    if req.mode == "live":
        if settings().branch_live_capture == "write-protect":
            note = "FORKD_BRANCH_LIVE_CAPTURE=write-protect"
        else:
            try:
                return PagedBranchJob(rt, req).start()
            except NotPaged as why:
                if settings().branch_live_capture == "pages":
                    raise Conflict(f"child {req.child_id} cannot be branched live by pages: {why}",
                                   hint="FORKD_BRANCH_LIVE_CAPTURE=auto takes the VMM's write-protect capture "
                                        "then") from None
                note = str(why)
                log.info("branch %r of child %s: the VMM's write-protect capture, not pages: %s", req.tag,
                         req.child_id, note)
    job = BranchJob(rt, req)
    job.not_paged = note if settings().branch_live_capture == "auto" else None  # its refusal says why not pages
    res = job.start()
    res.capture_note = note
    return res
