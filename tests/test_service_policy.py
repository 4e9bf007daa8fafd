"""The service's policy tables (forkd.service.policy): how long a new sandbox lives and what an unnamed branch is
called, the same for `forkd fork` in-process and for the daemon's routes. Pure functions: no VM, no home."""

from __future__ import annotations

import pytest

from forkd.service import policy


@pytest.mark.parametrize("asked, default, pool, want", [
    (120.0, 300.0, None, 120.0),   # the call's own lifetime wins
    (None, 300.0, None, 300.0),    # else the node's FORKD_SANDBOX_TIMEOUT
    (None, 0.0, None, None),       # 0: no timeout
    (None, 300.0, "web", None),    # a pool's idle children: none until claimed
    (60.0, 300.0, "web", 60.0),    # ... unless the call gives one
])
def test_lifetime(asked, default, pool, want):
    assert policy.lifetime(asked, default, pool) == want


def test_an_unnamed_branch_is_named_and_labelled_for_collection():
    assert policy.branch_tag(None, "c1", 1700000000.7) == "branch-c1-1700000000"
    assert policy.branch_labels(None) == {policy.AUTO: "branch"}


def test_a_named_branch_is_the_callers():
    assert policy.branch_tag("mine", "c1", 1.0) == "mine"
    assert policy.branch_labels("mine") == {}
