"""The one door every front end goes through: the `Backend` protocol, and `backend()`, which picks the daemon when
one is configured or answers (so state has one owner), else the in-process LocalBackend.

Results are the wire models of forkd.service.wire where a verb has one (eval, exec, ping, branch, settle: the same
model from both implementations, tests/test_backend_contract.py), children forkd.service.listing.ChildView
(children, child, fork, fork_from, claim, set_timeout), snapshots its SnapshotView (snapshots and the builds), else
plain JSON data (the shapes `forkd VERB -o json` prints); a verb whose parameters travel together takes one request
model (from_image, build_debian). Failures are forkd.base.errors types, the same from both implementations (the
remote one maps the daemon's problem+json back to them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the in-process runtime, reconciler and models load only when a verb needs them
    from forkd.core.requests import Branch, Compaction, Egress, LayerBuild, ParentBuild, Spawn
    from forkd.reconciler.control import Change
    from forkd.service.listing import ChildView, SnapshotView
    from forkd.service.wire import (
        BranchAnswer,
        DebianBuildRequest,
        EvalAnswer,
        ExecResult,
        FromImageRequest,
        PingResult,
        SnapshotInfo,
    )
    from forkd.spec.models import ForkObject

ObjList = list[tuple["ForkObject", str]]
Progress = Callable[[str], None]
Json = dict[str, Any]


class Backend(Protocol):
    is_local: bool  # paths in results (agent sockets, pack files) are on this host

    # declarative objects
    def apply(self, objs: ObjList, applyset: str, prune: bool = False, dry_run: bool = False,
              manager: str = "cli", force: bool = False) -> list[Change]: ...
    def diff(self, objs: ObjList) -> list[tuple[str, str]]: ...
    def get(self, kind: str, name: str | None = None) -> list[ForkObject]: ...
    def describe(self, kind: str, name: str) -> Json: ...
    def delete(self, kind: str, name: str) -> None: ...
    def claim(self, pool: str, n: int = 1, lifetime: float | None = None) -> list[ChildView]: ...
    def wait(self, targets: list[tuple[str, str]], timeout: float,
             progress: Progress = ...) -> tuple[bool, list[str]]: ...
    # images
    def build_image(self, force: bool = False, progress: Progress = ...) -> Json: ...
    def build_debian(self, req: DebianBuildRequest, progress: Progress = ...) -> Json: ...
    def from_image(self, req: FromImageRequest, progress: Progress = ...) -> Json: ...
    # snapshots
    def snapshots(self) -> list[SnapshotView]: ...
    def snapshot_info(self, tag: str) -> Json: ...
    def create_snapshot(self, req: ParentBuild, progress: Progress = ...) -> SnapshotView: ...
    def snapshot_diff(self, req: LayerBuild, progress: Progress = ...) -> SnapshotView: ...
    def compact(self, req: Compaction, progress: Progress = ...) -> SnapshotView: ...
    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]: ...
    # children
    def children(self, labels: list[str] | None = None) -> list[ChildView]: ...
    def child(self, child_id: str) -> ChildView: ...
    def set_timeout(self, child: str, seconds: float) -> ChildView: ...
    def port(self, child: str, port: int, close: bool = False) -> Json: ...
    def fork_from(self, child: str, n: int = 1, tag: str | None = None, keep: bool = False,
                  lifetime: float | None = None, egress: Egress | None = None) -> list[ChildView]: ...
    def fork(self, req: Spawn, progress: Progress = ...) -> list[ChildView]: ...
    def exec(self, child: str, argv: list[str], cwd: str | None = None, timeout: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult: ...
    def eval(self, child: str, code: str, timeout: float = 60.0) -> EvalAnswer: ...
    def files(self, child: str) -> Any: ...  # LocalFiles / RemoteFiles: list, stat, streams, tar, watch
    def ping(self, child: str) -> PingResult: ...
    def kill(self, ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> list[list]: ...
    def branch(self, req: Branch) -> BranchAnswer: ...
    def settle(self, tag: str) -> SnapshotInfo | None: ...
    # the host the backend runs on
    def gc(self, dry_run: bool = False, grace: float | None = None) -> Json: ...
    def doctor(self, reprobe: bool = False, progress: Progress = ...) -> list[Json]: ...
    def audit_verify(self) -> Json: ...
    def pack(self, tag: str, path: str, level: int = 3, progress: Progress = ...) -> Json: ...
    def unpack(self, path: str, progress: Progress = ...) -> Json: ...
    def pull(self, ref: str, hub: str | None = None, progress: Progress = ...,
             on_bytes: Callable[[int, int], None] | None = None) -> Json: ...
    def push(self, tag: str, ref: str, hub: str | None = None, force: bool = False,
             progress: Progress = ...) -> Json: ...
    def snapshot_push(self, req: Any, progress: Progress = ...) -> Json: ...  # wire.SnapshotPushRequest
    def snapshot_pull(self, req: Any, progress: Progress = ...) -> Json: ...  # wire.SnapshotPullRequest


def backend() -> Backend:
    """FORKD_URL (+ FORKD_TOKEN) names a daemon on TCP; else the local daemon's socket if one answers; else
    in-process (FORKD_NO_DAEMON=1 forces that). The in-process runtime is imported only in that last case."""
    from forkd.base.settings import settings

    if not settings().no_daemon:
        from forkd.client.http import find_daemon

        endpoint = find_daemon(probe=True)
        if endpoint:
            from forkd.client.remote import RemoteBackend

            return RemoteBackend(endpoint=endpoint)
    from forkd.client.local import LocalBackend

    return LocalBackend()


def __getattr__(name: str) -> Any:
    """`from forkd.client.backends import LocalBackend, RemoteBackend` still works, loading that side on use."""
    if name == "LocalBackend":
        from forkd.client.local import LocalBackend

        return LocalBackend
    if name == "RemoteBackend":
        from forkd.client.remote import RemoteBackend

        return RemoteBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
