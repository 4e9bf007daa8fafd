"""BRANCH, as callers know it: `branch(rt, Branch)`, its result, and waiting for background conversions.
The handlers are forkd.core.pipeline.branch (modes live and full) and forkd.core.pipeline.branch_diff (diff)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkd.core.pipeline.branch import BranchJob, BranchResult, wait_background
from forkd.core.pipeline.branch_diff import DiffBranchJob
from forkd.core.requests import Branch

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

__all__ = ["BranchResult", "branch", "wait_background"]


def branch(rt: Runtime, req: Branch) -> BranchResult:
    """Snapshot the running child `req.child_id` as `req.tag`. See forkd.core.pipeline.branch.

    `req.tmp_dir` (default $FORKD_HOME/tmp) holds the transient files (live and full: the whole RAM stream; diff:
    the pages the child wrote). `req.labels` are added to the new snapshot's (the source snapshot's labels are
    not inherited: they say who owns *that* snapshot)."""
    return (DiffBranchJob if req.mode == "diff" else BranchJob)(rt, req).start()
