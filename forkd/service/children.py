"""Children (sandboxes) through the service: spawn, fork from a running one, kill, lifetimes and labels, branch,
and the calls into a guest. Every one of these is what both `/v1/children` and its compatibility layer
`/v1/sandboxes`, and LocalBackend, call: the policy (forkd.service.policy) is applied here once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from forkd.base import clock
from forkd.base.settings import settings
from forkd.core import forking, lifetimes
from forkd.core.requests import Branch, Egress, Spawn
from forkd.sandbox.child import RESIDENCY  # noqa: F401 - the residency names, for the daemon's metrics
from forkd.service import policy
from forkd.service.listing import ChildView
from forkd.service.wire import ExecResult, PingResult, child_view

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class Children:
    """The child verbs of forkd.service.service.Service (`self.rt`: the node's Runtime)."""

    rt: Any
    template: Callable[[str], str]  # forkd.service.service.Service.template

    def children(self, labels: list[str] | None = None) -> list[ChildView]:
        """The children whose labels match every `k=v` (or bare `k`) in `labels`, as every door lists them."""
        sel = lifetimes.parse_selector(labels)
        return [child_view(r) for r in self.rt.children() if lifetimes.matches(r.labels, sel)]

    views = children  # the routes' name

    def view(self, child_id: str) -> ChildView:
        """One child's view; NotFound if there is no such child."""
        return child_view(self.rt.child(child_id))

    def spawn(self, req: Spawn, lifetime: float | None = None, labels: dict[str, str] | None = None,
              progress: Progress = _quiet) -> list[ChildView]:
        """`req.n` children of `req.tag` (a snapshot, or a ForkParent/ForkLayer/ForkBranch's ready one), each
        living `lifetime` (default FORKD_SANDBOX_TIMEOUT; a pool's: none) with `labels`."""
        tag = self.template(req.tag)
        recs = self.rt.fork(req if tag == req.tag else req.model_copy(update={"tag": tag}), progress=progress)
        seconds = policy.lifetime(lifetime, settings().sandbox_timeout, req.pool)
        if seconds is not None or labels:
            recs = lifetimes.stamp(self.rt, [r.id for r in recs], seconds, labels)
        return [child_view(r) for r in recs]

    def fork_from(self, child_id: str, n: int = 1, tag: str | None = None, keep: bool = False,
                  lifetime: float | None = None, labels: dict[str, str] | None = None, timeout: float = 60.0,
                  egress: Egress | None = None) -> tuple[Any, list[ChildView]]:
        """`n` children continuing from this instant of `child_id` (forkd.core.forking): (the branch, views).
        Without `keep` or `tag` the branch snapshot goes with the last of them (`kill`, else the sweeper)."""
        seconds = policy.lifetime(lifetime, settings().sandbox_timeout)
        res, recs = forking.fork(self.rt, child_id, n, tag=tag, keep=keep, lifetime=seconds, labels=labels,
                                 timeout=timeout, egress=egress)
        return res, [child_view(r) for r in recs]

    def set_timeout(self, child_id: str, seconds: float) -> ChildView:
        """Keepalive: `child_id` now expires `seconds` from now (a running daemon's sweeper enforces it)."""
        return child_view(lifetimes.set_timeout(self.rt, child_id, seconds))

    def kill_one(self, child_id: str) -> None:
        """Stop one child: NotFound if there is none; a fork(n) snapshot goes with its last child."""
        self.view(child_id)
        self.kill([child_id])

    def kill(self, ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> list[tuple[str, bool]]:
        """Stop children: `ids`, all, or those of snapshot `tag`; a fork(n) snapshot goes with its last child."""
        tags = {c.snapshot for c in self.rt.children() if all_ or c.id in (ids or ()) or c.snapshot == tag}
        killed = self.rt.kill(ids, all_=all_, tag=tag)
        for t in tags:
            lifetimes.release_fork_of(self.rt, t)
        return killed

    def branch(self, child_id: str, tag: str | None = None, mode: str = "live", wait: bool = True) -> Any:
        """Snapshot a running child as `tag`; unnamed, forkd names it and removes it after FORKD_BRANCH_TTL."""
        name = policy.branch_tag(tag, child_id, clock.wall())
        return self.rt.branch(Branch.of(child_id=child_id, tag=name, mode=mode, wait=wait,
                                        labels=policy.branch_labels(tag)))

    def branch_request(self, req: Branch) -> Any:
        """A branch the caller named in full (the CLI's request)."""
        return self.rt.branch(req)

    def settle(self, tag: str) -> Any:
        """After a `wait=False` branch: wait for this process's background conversion; the snapshot as it ended."""
        from forkd.core.branch import wait_background

        wait_background(self.rt)
        return self.rt.store.get(tag)

    # -- calls into a guest ------------------------------------------------------------------------
    def exec(self, child_id: str, argv: list[str], cwd: str | None = None, timeout: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:
        return ExecResult(**self.rt.exec(child_id, argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout))

    def eval(self, child_id: str, code: str, timeout: float = 60.0, mode: str = "eval") -> dict[str, Any]:
        """`mode` eval: an expression's value; exec: statements run (their stdout)."""
        call = self.rt.eval if mode == "eval" else self.rt.exec_code
        return call(child_id, code, timeout=timeout)

    def ping(self, child_id: str) -> PingResult:
        return PingResult(**{**self.rt.ping(child_id), "pong": True})

    def agent(self, child_id: str) -> AbstractContextManager:
        """The child's agent, held awake while the block runs (forkd.core.runtime.Runtime.agent)."""
        return self.rt.agent(child_id)
