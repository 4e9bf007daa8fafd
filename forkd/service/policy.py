"""What a call means beyond the core, as pure functions over data: how long a new sandbox lives, what an
unnamed branch or fork snapshot is called and labelled. The service (forkd.service.service) applies them to every
call, in-process or through the daemon; tests/test_service_policy.py holds their tables."""

from __future__ import annotations

from forkd.core.lifetimes import AUTO  # snapshots forkd named itself: the sweeper removes them by it


def lifetime(asked: float | None, default: float, pool: str | None = None) -> float | None:
    """Seconds a new sandbox lives: what the call asked, else the node's default (FORKD_SANDBOX_TIMEOUT; 0: none).
    A pool's idle children have none: the reconciler owns them until a claim gives them one."""
    if asked:
        return asked
    if pool is not None:
        return None
    return default or None


def branch_tag(tag: str | None, child_id: str, now: float) -> str:
    """The branch snapshot's tag: the caller's, else one forkd names (`branch-<child>-<unix seconds>`)."""
    return tag or f"branch-{child_id}-{int(now)}"


def branch_labels(tag: str | None) -> dict[str, str]:
    """A branch forkd named itself is removed FORKD_BRANCH_TTL after it was written unless used (the sweeper)."""
    return {} if tag else {AUTO: "branch"}
