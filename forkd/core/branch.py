"""BRANCH, as callers know it: `branch(rt, Branch)`, its result, and waiting for background conversions.
The handler itself is forkd.core.pipeline.branch."""

from forkd.core.pipeline.branch import MAX_IN_FLIGHT, BranchResult, branch, wait_background

__all__ = ["MAX_IN_FLIGHT", "BranchResult", "branch", "wait_background"]
