"""RemoteBackend: every verb through a running daemon (`forkd serve`), over its unix socket or over TCP with a
bearer token. It calls the native routes (`/v1/children`, `/v1/{plural}`, `/v1/snapshots`: docs/rest.md), whose
answers are LocalBackend's (child and snapshot listings are forkd.service.listing's views on both sides); failures
are forkd.base.errors types. Only opening a port goes through the SDK's client (forkd.client.api.Client).

A build is a job on the daemon (forkd.service.jobs): submitted, then waited on with long polls of `GET /v1/jobs/{id}`
(Ctrl-C while waiting cancels it: DELETE /v1/jobs/{id}),
each new phase of it reported as a progress line; a failed one raises the error kind the daemon recorded. Other long
verbs report one progress line (the daemon does the work and answers when it is done)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from forkd.client.http import UNREACHABLE, Call, Endpoint, SyncHttp, quote
from forkd.service.listing import ChildView, SnapshotView

if TYPE_CHECKING:  # loaded by the verbs that take or return them (declarative objects), not by every verb
    from forkd.core.requests import Branch, Compaction, Egress, LayerBuild, ParentBuild, Spawn
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
LONG = 3600.0  # builds, forks of many children, packs: minutes under TCG


def _quiet(_: str) -> None:
    pass


class _Plain(SyncHttp):
    """The transport alone (retries, typed errors) with the runtime's hint for a daemon that cannot be reached."""

    unreachable_hint = UNREACHABLE


class RemoteBackend:
    """A running `forkd serve`: at `endpoint` (see forkd.client.http.find_daemon), or over the unix socket
    `socket_path`, or at TCP `url` with a bearer `token`."""

    def __init__(self, socket_path: str | None = None, timeout: float = 600.0, url: str | None = None,
                 token: str | None = None, *, endpoint: Endpoint | None = None, http: Any = None,
                 plain: bool = False):
        """`http`: another sender of Calls to `endpoint` (`_send(call)`, as SyncHttp's), e.g. the CLI's own.
        `plain`: answers stay the daemon's JSON where they would be models (get, ping, eval), and fork takes its
        request as JSON too, so a caller that only prints them (the CLI) loads no pydantic: the daemon validates."""
        if endpoint is None:
            endpoint = Endpoint(url.rstrip("/"), None, token) if url else Endpoint("http://forkd", socket_path, token)
        self.endpoint, self._timeout, self._api, self.plain = endpoint, timeout, None, plain
        self.http = http or _Plain(endpoint, timeout=timeout)
        self.is_local = endpoint.is_local  # a TCP daemon's agent sockets and files are on its host, not ours

    @property
    def api(self) -> Any:
        """The SDK's client (forkd.client.api.Client), made on first use: the routes whose answers are its models
        (exec, eval, ping, branch, files) need it; the rest send JSON through `http` without loading the models."""
        if self._api is None:
            from forkd.client.api import Client

            self._api = Client(at=self.endpoint, timeout=self._timeout)
        return self._api

    def _call(self, method: str, path: str, timeout: float | None = None, **kw) -> Any:
        return self.http._send(Call(method, path, timeout=timeout, **kw))

    def _long(self, progress: Progress, method: str, path: str, json: Any) -> Any:
        progress(f"working on the daemon at {self.endpoint.where}; waiting for its answer")
        return self._call(method, path, timeout=LONG, json=json)

    def _job(self, progress: Progress, path: str, json: Any) -> Any:
        """A build on the daemon: submit it (202: its job), report each phase it reaches, answer its result."""
        from forkd_client import jobs

        job = jobs.submitted(self._call("POST", path, json=json))
        if job.id:
            progress(f"job {job.id} on the daemon at {self.endpoint.where}")
        try:
            done = jobs.wait(self.api, job, LONG, on_phase=progress)
        except KeyboardInterrupt:  # Ctrl-C stops the build, as it does one run in-process
            if job.id:
                self._cancel_interrupted(job.id)
            raise
        return jobs.outcome(done, url=f"{self.endpoint.where}{path}")

    def _cancel_interrupted(self, job_id: str) -> None:
        """Cancel the job a caller stopped waiting for (best effort: said on stderr, never raised over the
        interrupt)."""
        import sys

        try:
            self.cancel_job(job_id)
            print(f"interrupted: job {job_id} cancelled on the daemon", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - the interrupt is what the caller sees
            print(f"interrupted: job {job_id} was not cancelled ({exc}); cancel it: forkd job cancel {job_id}",
                  file=sys.stderr)

    def _here(self, views: list[dict[str, Any]]) -> list[ChildView]:
        """Child views with agent sockets only where they are reachable (the daemon's host)."""
        got = [ChildView.from_json(v) for v in views]
        return got if self.is_local else [v.elsewhere() for v in got]

    def _child(self, child: str, call: str) -> str:
        return f"/v1/children/{quote(child)}/{call}"

    # -- declarative objects -------------------------------------------------------------------------
    @staticmethod
    def _docs(objs: ObjList) -> list[dict]:
        from forkd.spec.models import to_document

        return [{"document": to_document(o, with_status=False), "source": src} for o, src in objs]

    def apply(self, objs, applyset, prune=False, dry_run=False, manager="cli", force=False):
        res = self._call("POST", "/v1/apply", json={"items": self._docs(objs), "applyset": applyset,
                                                   "prune": prune, "dry_run": dry_run, "manager": manager,
                                                   "force": force})
        from forkd.reconciler.control import Change

        return [Change(**c) for c in res["changes"]]

    def diff(self, objs):
        return [tuple(x) for x in self._call("POST", "/v1/diff", json={"items": self._docs(objs)})["diffs"]]

    @staticmethod
    def _kind(kind: str, name: str | None = None) -> str:
        from forkd.spec.kinds import PLURALS

        if kind not in PLURALS:
            from forkd.base.errors import NotFound

            raise NotFound(f"unknown kind {kind!r}", hint=f"one of {', '.join(PLURALS)}")
        return f"/v1/{PLURALS[kind]}" + (f"/{quote(name)}" if name else "")

    def get(self, kind, name=None):
        """The objects (documents, with `plain`)."""
        got = self._call("GET", self._kind(kind, name))
        docs = [got] if name else got
        if self.plain:
            return docs
        from forkd.spec.models import MODELS

        return [MODELS[d["kind"]].model_validate(d) for d in docs]

    def describe(self, kind, name):
        return self._call("GET", self._kind(kind, name) + "/describe")

    def delete(self, kind, name):
        self._call("DELETE", self._kind(kind, name))

    def capacity(self) -> dict[str, Any]:
        """The node's capacity (GET /v1/node: memoryAvailableMiB, childrenRunning, pools)."""
        return self._call("GET", "/v1/node")

    def claim(self, pool, n=1, lifetime=None):
        body = {"n": n} if lifetime is None else {"n": n, "lifetime_secs": lifetime}
        return self._here(self._call("POST", f"/v1/pools/{quote(pool)}/claim", json=body)["children"])

    def wait(self, targets, timeout, progress=_quiet):
        res = self._call("POST", "/v1/wait", json={"targets": targets, "timeout": timeout}, timeout=timeout + 30)
        return res["ok"], res["problems"]

    # -- images --------------------------------------------------------------------------------------
    def build_image(self, force: bool = False, progress: Progress = _quiet) -> dict[str, Any]:
        return self._job(progress, "/v1/images/build", {"force": force})

    def build_debian(self, req: DebianBuildRequest, progress: Progress = _quiet) -> dict[str, Any]:
        return self._job(progress, "/v1/images/debian", req.model_dump(mode="json"))

    def from_image(self, req: FromImageRequest, progress: Progress = _quiet) -> dict[str, Any]:
        return self._job(progress, "/v1/snapshots/build/from-image", req.model_dump(mode="json"))

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshots(self) -> list[SnapshotView]:
        return [SnapshotView.from_json(s) for s in self._call("GET", "/v1/snapshots")]

    def snapshot_info(self, tag: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/snapshots/{quote(tag)}/info")

    def _build(self, progress: Progress, what: str, req: Any) -> SnapshotView:
        return SnapshotView.from_json(self._job(progress, f"/v1/snapshots/build/{what}", req.model_dump(mode="json")))

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet) -> SnapshotView:
        return self._build(progress, "parent", req)

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet) -> SnapshotView:
        return self._build(progress, "layer", req)

    def compact(self, req: Compaction, progress: Progress = _quiet) -> SnapshotView:
        return self._build(progress, "compaction", req)

    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]:
        params = {k: "true" for k, v in (("cascade", cascade), ("force", force)) if v}
        return self._call("POST", f"/v1/snapshots/{quote(tag)}/delete", params=params)["deleted"]

    # -- children ------------------------------------------------------------------------------------
    def children(self, labels: list[str] | None = None) -> list[ChildView]:
        return self._here(self._call("GET", "/v1/children", params={"label": labels} if labels else None))

    def child(self, child_id: str) -> ChildView:
        return self._here([self._call("GET", f"/v1/children/{quote(child_id)}")])[0]

    def set_timeout(self, child: str, seconds: float) -> ChildView:
        return self._here([self._call("POST", self._child(child, "timeout"), json={"timeout_secs": seconds})])[0]

    def fork_from(self, child: str, n: int = 1, tag: str | None = None, keep: bool = False,
                  lifetime: float | None = None, egress: Egress | None = None) -> list[ChildView]:
        from forkd.core.requests import egress_json

        body = {"n": n, "tag": tag, "keep": keep, "lifetime": lifetime,
                "egress": None if egress is None else egress_json(egress)}
        return self._here(self._call("POST", self._child(child, "fork"), timeout=LONG, json=body))

    def port(self, child: str, port: int, close: bool = False) -> dict[str, Any]:
        """Open TCP `port` of `child` through the daemon (its URL when the daemon is reached over TCP), or revoke."""
        if close:
            self.api.close_port(child, port)
            return {"sandbox_id": child, "port": port, "closed": True}
        grant = self.api.open_port(child, port).model_dump(mode="json")
        return dict(grant, url=None if self.is_local else self.api.endpoint.base_url + grant["path"])

    def fork(self, req: Spawn | dict[str, Any], progress: Progress = _quiet) -> list[ChildView]:
        """`req`: a Spawn, or (`plain`) its JSON, which the daemon validates (422 naming the field)."""
        body = req if isinstance(req, dict) else req.model_dump(mode="json")
        res = self._long(progress, "POST", "/v1/children", body)
        return self._here(res["children"])

    def exec(self, child: str, argv: list[str], cwd: str | None = None, timeout: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:
        from forkd.service.wire import ExecResult

        # no timeout in-process means the agent's call limit (300 s): the same here
        body = {"args": argv, "timeout_secs": timeout or 300, "cwd": cwd, "env": env, "stdin": stdin}
        res = self._call("POST", self._child(child, "exec"), json=body)
        return ExecResult.model_validate(res)

    def eval(self, child: str, code: str, timeout: float = 60.0) -> EvalAnswer:
        """The answer (its JSON, with `plain`)."""
        res = self._call("POST", self._child(child, "eval"), json={"code": code, "timeout_secs": timeout})
        answer = {"value": res.get("result"), "error": res.get("error"), "stdout": res.get("stdout", "")}
        if self.plain:
            return answer  # type: ignore[return-value] - EvalAnswer's fields, as JSON
        from forkd.service.wire import EvalAnswer

        return EvalAnswer(**answer)

    def files(self, child: str):
        """The files of a child through the daemon (forkd.client.files_remote.RemoteFiles)."""
        from forkd.client.files_remote import RemoteFiles

        files = RemoteFiles(self.api, child)
        files.base = self._child(child, "files")
        return files

    def ping(self, child: str) -> PingResult:
        """The agent's answer (its JSON, with `plain`)."""
        res = self._call("POST", self._child(child, "ping"))
        if self.plain:
            return res
        from forkd.service.wire import PingResult

        return PingResult.model_validate(res)

    def kill(self, ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> list[list]:
        return self._call("POST", "/v1/children/kill", json={"ids": ids or [], "all": all_, "tag": tag})["killed"]

    def branch(self, req: Branch) -> BranchAnswer:
        from forkd.service.wire import BranchResult, branch_answer

        body = {"tag": req.tag, "mode": req.mode, "wait": req.wait}
        res = self._call("POST", self._child(req.child_id, "branch"), json=body)
        return branch_answer(BranchResult.model_validate(res))

    def settle(self, tag: str) -> SnapshotInfo | None:
        """The daemon converts a `wait=False` branch itself: nothing to wait for here."""
        return None

    # -- jobs ----------------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/jobs")

    def job(self, job_id: str, wait_secs: float = 0.0, since: int | None = None) -> dict[str, Any]:
        params = {"wait_secs": wait_secs, **({"since": since} if since is not None else {})} if wait_secs else None
        return self._call("GET", f"/v1/jobs/{quote(job_id)}", params=params, timeout=wait_secs + 30 if wait_secs
                          else None)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/jobs/{quote(job_id)}")

    # -- the daemon's host ---------------------------------------------------------------------------
    def gc(self, dry_run: bool = False, grace: float | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/gc", json={"dry_run": dry_run, "grace": grace})

    def doctor(self, reprobe: bool = False, progress: Progress = _quiet) -> list[dict[str, Any]]:
        return self._long(progress, "POST", "/v1/doctor", {"reprobe": reprobe})

    def audit_verify(self) -> dict[str, Any]:
        return self._call("GET", "/v1/audit/verify")

    def pack(self, tag: str, path: str, level: int = 3, progress: Progress = _quiet) -> dict[str, Any]:
        return self._long(progress, "POST", "/v1/pack", {"tag": tag, "path": path, "level": level})

    def unpack(self, path: str, progress: Progress = _quiet) -> dict[str, Any]:
        return self._long(progress, "POST", "/v1/unpack", {"path": path})

    def pull(self, ref: str, hub: str | None = None, progress: Progress = _quiet,
             on_bytes: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        return self._long(progress, "POST", "/v1/pull", {"ref": ref, "hub": hub})

    def push(self, tag: str, ref: str, hub: str | None = None, force: bool = False,
             progress: Progress = _quiet) -> dict[str, Any]:
        return self._long(progress, "POST", "/v1/push", {"tag": tag, "ref": ref, "hub": hub, "force": force})

    def snapshot_push(self, req: Any, progress: Progress = _quiet) -> dict[str, Any]:
        return self._long(progress, "POST", "/v1/snapshots/push", req.model_dump(mode="json"))

    def snapshot_pull(self, req: Any, progress: Progress = _quiet) -> dict[str, Any]:
        return self._long(progress, "POST", "/v1/snapshots/pull", req.model_dump(mode="json"))
