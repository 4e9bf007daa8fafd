"""Fork as a verb: `fork(rt, id, n)` gives `n` running children that continue from this instant of sandbox `id`
(a diff branch: the source pauses only while its device state and the pages it wrote are taken, a few ms; then
`n` spawns of it). The branch is a layer over the source's snapshot, which therefore stays until the branch goes.
Where a diff branch is refused up front (an old kernel, another connection holding the agent, a deep chain), the
branch is live instead.
The children get the source's egress (forkd.core.requests.Egress) unless the caller names another.
Without `keep` or `tag` the branch snapshot is labelled `forkd.dev/auto: fork` and goes with the last of its
children (the DELETE route releases it at once, the daemon's sweeper otherwise: forkd.core.lifetimes)."""

from __future__ import annotations

import time
from typing import Any

from forkd.base.errors import ForkdError
from forkd.core import lifetimes
from forkd.core.pipeline.branch_diff import DiffUnavailable
from forkd.core.requests import Branch, Egress, Spawn, parse_egress


def fork(rt: Any, child_id: str, n: int, tag: str | None = None, keep: bool = False,
         lifetime: float | None = None, labels: dict[str, str] | None = None,
         timeout: float = 60.0, egress: Egress | None = None) -> tuple[Any, list]:
    """Returns (the branch result, the new children's records). `egress`: None keeps the source's."""
    from forkd.core.branch import branch as do_branch

    if egress is None:
        egress = parse_egress(getattr(rt.child(child_id), "egress", "none"), f"child {child_id}'s recorded egress")
    name = tag or f"fork-{child_id}-{int(time.time() * 1000)}"
    auto = {} if (tag or keep) else {lifetimes.AUTO: "fork"}
    try:
        res = do_branch(rt, Branch.of(child_id=child_id, tag=name, mode="diff", wait=True, labels=auto))
    except DiffUnavailable:  # refused before anything was written or paused: a live branch instead
        res = do_branch(rt, Branch.of(child_id=child_id, tag=name, mode="live", wait=True, labels=auto))
    try:
        recs = rt.fork(Spawn.of(tag=name, n=n, timeout=timeout, egress=egress))
    except ForkdError:
        if auto:
            lifetimes.release(rt, name)
        raise
    marks = {**(labels or {}), "forkd.dev/fork-of": child_id}
    return res, lifetimes.stamp(rt, [x.id for x in recs], lifetime, marks)
