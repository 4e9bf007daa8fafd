"""BRANCH, as callers know it: `branch(rt, Branch)`, its result, and waiting for background conversions.
The handler itself is forkd.core.pipeline.branch."""

from forkd.core.pipeline.branch import BranchResult, branch, wait_background

__all__ = ["BranchResult", "branch", "wait_background"]
