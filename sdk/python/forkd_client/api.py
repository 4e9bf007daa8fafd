"""Every call of the daemon's REST API, written once: each method describes its request (a Call) and `_send`
performs it, synchronously in `Client` and as a coroutine in `AsyncClient`. Method names are upstream forkd's;
results are the models of forkd_client.models (dict access works too, `sb["id"]`). The runtime's front door
(forkd.client.api) is these clients too, finding the daemon its own way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from forkd_client import jobs
from forkd_client import models as wire
from forkd_client.http import AsyncHttp, Call, Endpoint, Retry, SyncHttp, find_daemon, quote

_SNAPS = TypeAdapter(list[wire.SnapshotInfo])
_SBXS = TypeAdapter(list[wire.SandboxInfo])
_PORTS = TypeAdapter(list[wire.PortGrantInfo])
_JOBS = TypeAdapter(list[wire.Job])


class ApiCalls:
    """The calls; `_send` comes from SyncHttp (results) or AsyncHttp (coroutines of results)."""

    _send: Callable[[Call], Any]

    # -- status ----------------------------------------------------------------------------------------
    def healthz(self) -> dict:
        return self._send(Call("GET", "/healthz"))

    def version(self) -> dict:
        return self._send(Call("GET", "/version"))

    # -- snapshots (upstream names) ------------------------------------------------------------------
    def list_snapshots(self) -> list[wire.SnapshotInfo]:
        return self._send(Call("GET", "/v1/snapshots", parse=_SNAPS.validate_python))

    def get_snapshot(self, tag: str) -> wire.SnapshotInfo:
        return self._send(Call("GET", f"/v1/snapshots/{quote(tag)}", parse=wire.SnapshotInfo.model_validate))

    def snapshot_info(self, tag: str) -> wire.SnapshotDetail:
        return self._send(Call("GET", f"/v1/snapshots/{quote(tag)}/info", parse=wire.SnapshotDetail.model_validate))

    def submit_snapshot(self, tag: str, memory_mib: int = 512, vcpus: int = 1, warm_imports: list[str] = (),
                        warm_run: list[str] = (), warm_exec: list[str] = (),
                        from_tag: str | None = None) -> wire.Job:
        """Start building snapshot `tag` (a parent; with `from_tag`, a layer on it): the job, at once."""
        body = {"tag": tag, "memory_mib": memory_mib, "vcpus": vcpus, "warm_imports": list(warm_imports),
                "warm_run": list(warm_run), "warm_exec": list(warm_exec), "from_tag": from_tag}
        return self._send(Call("POST", "/v1/snapshots", json={k: v for k, v in body.items() if v is not None},
                               params={"wait": "false"}, parse=jobs.submitted))

    def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        params = {k: "true" for k, v in (("cascade", cascade), ("force", force)) if v}
        return self._send(Call("DELETE", f"/v1/snapshots/{quote(tag)}", params=params))

    def submit_compaction(self, tag: str, to: str) -> wire.Job:
        """Start writing the chain head `tag` as a new base snapshot `to`: the job, at once."""
        return self._send(Call("POST", f"/v1/snapshots/{quote(tag)}/compact", json={"to": to},
                               params={"wait": "false"}, parse=jobs.submitted))

    # -- jobs (builds running on the daemon) ----------------------------------------------------------
    def get_job(self, job_id: str, wait_secs: float | None = None, since: int | None = None) -> wire.Job:
        """A job; with `wait_secs`, the daemon answers once its `version` is past `since` (or it is finished),
        else after `wait_secs`."""
        params = {k: v for k, v in (("wait_secs", wait_secs), ("since", since)) if v is not None}
        timeout = None if wait_secs is None else wait_secs + 30
        return self._send(Call("GET", f"/v1/jobs/{quote(job_id)}", params=params or None, timeout=timeout,
                               parse=wire.Job.model_validate))

    def list_jobs(self) -> list[wire.Job]:
        """The daemon's jobs, newest first (the finished ones it still keeps)."""
        return self._send(Call("GET", "/v1/jobs", parse=_JOBS.validate_python))

    def cancel_job(self, job_id: str) -> wire.Job:
        """Cancel a queued or running job: a queued one answers `cancelled`; a running one answers still `running`
        (phase `cancelling`) and ends `cancelled` once its build has stopped (`wait_job`). Conflict for a finished
        job, naming its state."""
        return self._send(Call("DELETE", f"/v1/jobs/{quote(job_id)}", parse=wire.Job.model_validate))

    # -- sandboxes (upstream names) ------------------------------------------------------------------
    def spawn_sandboxes(self, snapshot_tag: str, n: int = 1, per_child_netns: bool = False,
                        memory_limit_mib: int | None = None, lifetime_secs: float | None = None,
                        labels: dict[str, str] | None = None,
                        egress: wire.Egress | None = None) -> list[wire.SandboxInfo]:
        """Fork `n` children of a snapshot. `lifetime_secs`, `labels` (metadata) and `egress` ("none", "internet"
        or {"allow": ["CIDR:port", ...]}; the daemon's default: none) are sent only when given."""
        body: dict[str, Any] = {"snapshot_tag": snapshot_tag, "n": n, "per_child_netns": per_child_netns}
        for k, v in (("memory_limit_mib", memory_limit_mib), ("lifetime_secs", lifetime_secs), ("labels", labels),
                     ("egress", egress)):
            if v is not None:
                body[k] = v
        return self._send(Call("POST", "/v1/sandboxes", json=body, parse=_SBXS.validate_python))

    def list_sandboxes(self, labels: dict[str, str] | None = None) -> list[wire.SandboxInfo]:
        """`labels`: only sandboxes carrying all of them (GET /v1/sandboxes?label=k=v)."""
        params = {"label": [f"{k}={v}" for k, v in labels.items()]} if labels else None
        return self._send(Call("GET", "/v1/sandboxes", params=params, parse=_SBXS.validate_python))

    def set_sandbox_timeout(self, sandbox_id: str, timeout_secs: float) -> wire.SandboxInfo:
        """Keepalive: the sandbox now lives `timeout_secs` from now."""
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/timeout",
                               json={"timeout_secs": timeout_secs}, parse=wire.SandboxInfo.model_validate))

    def fork_sandbox(self, sandbox_id: str, n: int = 1, tag: str | None = None, keep: bool = False,
                     lifetime_secs: float | None = None, labels: dict[str, str] | None = None,
                     egress: wire.Egress | None = None) -> list[wire.SandboxInfo]:
        """`n` running sandboxes continuing from this instant of `sandbox_id` (a live branch plus `n` spawns);
        `egress` None: the source's."""
        body = {"n": n, "tag": tag, "keep": keep, "lifetime_secs": lifetime_secs, "labels": labels or {},
                "egress": egress}
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/fork",
                               json={k: v for k, v in body.items() if v is not None}, parse=_SBXS.validate_python))

    def open_port(self, sandbox_id: str, port: int) -> wire.PortGrant:
        """A new authenticated path through the daemon to TCP `port` in the sandbox (`path`: append to base_url).
        Its token is in this answer only (the daemon keeps its hash)."""
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/ports", json={"port": port},
                               parse=wire.PortGrant.model_validate))

    def list_ports(self, sandbox_id: str) -> list[wire.PortGrantInfo]:
        """The sandbox's port grants (ids, ports; no tokens)."""
        return self._send(Call("GET", f"/v1/sandboxes/{quote(sandbox_id)}/ports", parse=_PORTS.validate_python))

    def close_port(self, sandbox_id: str, port: int | str) -> None:
        """Revoke every grant of `port` (a number), or the one grant with that id (a str like 'g...'): their URLs
        stop working."""
        which = str(int(port)) if isinstance(port, int) else quote(port)
        return self._send(Call("DELETE", f"/v1/sandboxes/{quote(sandbox_id)}/ports/{which}"))

    def get_sandbox(self, sandbox_id: str) -> wire.SandboxInfo:
        return self._send(Call("GET", f"/v1/sandboxes/{quote(sandbox_id)}", parse=wire.SandboxInfo.model_validate))

    def kill_sandbox(self, sandbox_id: str) -> None:
        return self._send(Call("DELETE", f"/v1/sandboxes/{quote(sandbox_id)}"))

    def branch_sandbox(self, sandbox_id: str, tag: str | None = None, mode: str = "live",
                       wait: bool = True) -> wire.BranchResult:
        body: dict[str, Any] = {"mode": mode, "wait": wait}
        if tag is not None:
            body["tag"] = tag
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/branch", json=body,
                               parse=wire.BranchResult.model_validate))

    def exec_command(self, sandbox_id: str, args: list[str], timeout_secs: float = 30, cwd: str | None = None,
                     env: dict[str, str] | None = None, stdin: str | None = None) -> wire.ExecResult:
        body = {"args": list(args), "timeout_secs": timeout_secs, "cwd": cwd, "env": env, "stdin": stdin}
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/exec",
                               json={k: v for k, v in body.items() if v is not None},
                               parse=wire.ExecResult.model_validate))

    def eval_code(self, sandbox_id: str, code: str, timeout_secs: float = 60, mode: str = "eval") -> wire.EvalResult:
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/eval",
                               json={"code": code, "timeout_secs": timeout_secs, "mode": mode},
                               parse=wire.EvalResult.model_validate))

    def ping_sandbox(self, sandbox_id: str) -> wire.PingResult:
        return self._send(Call("POST", f"/v1/sandboxes/{quote(sandbox_id)}/ping", parse=wire.PingResult.model_validate))

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._send(Call("GET", f"/v1/sandboxes/{quote(sandbox_id)}/files", params={"path": path}, raw=True))

    def write_file(self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644) -> wire.FileWritten:
        content = data.encode() if isinstance(data, str) else bytes(data)
        return self._send(Call("PUT", f"/v1/sandboxes/{quote(sandbox_id)}/files", params={"path": path, "mode": mode},
                               content=content, parse=wire.FileWritten.model_validate))

    # -- forkd's own -----------------------------------------------------------------------------------
    def claim(self, pool: str, n: int = 1, lifetime_secs: float | None = None) -> list[wire.SandboxInfo]:
        """Hand out `n` warm children of a pool (forked on the spot if fewer are warm). They live `lifetime_secs`
        (default: the pool's child.ttlSeconds, else the daemon's FORKD_SANDBOX_TIMEOUT)."""
        body = {"n": n, **({"lifetime_secs": lifetime_secs} if lifetime_secs else {})}
        return self._send(Call("POST", f"/v1/pools/{quote(pool)}/claim", json=body,
                               parse=lambda d: _SBXS.validate_python(d["sandboxes"])))

    def apply(self, docs: list[dict] | str, applyset: str = "sdk", prune: bool = False,
              manager: str = "sdk", force: bool = False) -> list[dict]:
        """Apply declarative documents (dicts, or a YAML string with `---` separators); returns the changes."""
        if isinstance(docs, str):
            import yaml  # only for a YAML string: pass dicts to need no PyYAML

            docs = [d for d in yaml.safe_load_all(docs) if d]
        items = [{"document": d, "source": "sdk"} for d in docs]
        return self._send(Call("POST", "/v1/apply", json={"items": items, "applyset": applyset, "prune": prune,
                                                          "manager": manager, "force": force},
                               parse=lambda d: d["changes"]))

    def list_pools(self) -> list[dict]:
        return self._send(Call("GET", "/v1/pools"))

    def get_pool(self, name: str) -> dict:
        return self._send(Call("GET", f"/v1/pools/{quote(name)}"))

    def delete_pool(self, name: str) -> None:
        return self._send(Call("DELETE", f"/v1/pools/{quote(name)}"))

    def wait(self, targets: list[tuple[str, str]], timeout: float = 300) -> dict:
        """Block until the named objects are Ready, e.g. [("ForkPool", "agents")]: {ok, problems}."""
        return self._send(Call("POST", "/v1/wait", json={"targets": [list(t) for t in targets], "timeout": timeout}))


def endpoint(url: str | None = None, token: str | None = None, socket: str | Path | None = None) -> Endpoint:
    return find_daemon(url, socket, token)


class Client(ApiCalls, SyncHttp):
    """Synchronous client: `Client()` finds the daemon (see forkd_client.http)."""

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0, *, at: Endpoint | None = None, retry: Retry | None = None,
                 base_url: str | None = None):
        """`base_url` is upstream's name for `url`."""
        SyncHttp.__init__(self, at or endpoint(url or base_url, token, socket), timeout, retry)
        self.base_url, self.socket, self.token = self.endpoint.base_url, self.endpoint.socket, self.endpoint.token

    def create_snapshot(self, tag: str, *args: Any, timeout: float | None = None,
                        on_phase: jobs.Phase | None = None, **kw: Any) -> wire.SnapshotInfo:
        """Build snapshot `tag` (submit_snapshot's arguments) and wait for it (`timeout` seconds; None: as long as
        it takes); a failed build raises the error it failed with."""
        job = jobs.wait(self, self.submit_snapshot(tag, *args, **kw), timeout, on_phase)
        return wire.SnapshotInfo.model_validate(jobs.outcome(job))

    def compact_snapshot(self, tag: str, to: str, timeout: float | None = None) -> wire.SnapshotInfo:
        """Write the chain head `tag` as a new base snapshot `to`, waiting for it."""
        return wire.SnapshotInfo.model_validate(jobs.outcome(jobs.wait(self, self.submit_compaction(tag, to),
                                                                       timeout)))

    def wait_job(self, job_id: str, timeout: float | None = None, on_phase: jobs.Phase | None = None) -> wire.Job:
        """Block until the job is finished (Timeout after `timeout` seconds; the job keeps running)."""
        return jobs.wait(self, self.get_job(job_id), timeout, on_phase)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(ApiCalls, AsyncHttp):
    """The same methods as Client, as coroutines."""

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0, *, at: Endpoint | None = None, retry: Retry | None = None,
                 base_url: str | None = None):
        AsyncHttp.__init__(self, at or endpoint(url or base_url, token, socket), timeout, retry)
        self.base_url, self.socket, self.token = self.endpoint.base_url, self.endpoint.socket, self.endpoint.token

    async def create_snapshot(self, tag: str, *args: Any, timeout: float | None = None,
                              on_phase: jobs.Phase | None = None, **kw: Any) -> wire.SnapshotInfo:
        """Build snapshot `tag` and wait for it (as Client.create_snapshot)."""
        job = await jobs.wait_async(self, await self.submit_snapshot(tag, *args, **kw), timeout, on_phase)
        return wire.SnapshotInfo.model_validate(jobs.outcome(job))

    async def compact_snapshot(self, tag: str, to: str, timeout: float | None = None) -> wire.SnapshotInfo:
        job = await jobs.wait_async(self, await self.submit_compaction(tag, to), timeout)
        return wire.SnapshotInfo.model_validate(jobs.outcome(job))

    async def wait_job(self, job_id: str, timeout: float | None = None,
                       on_phase: jobs.Phase | None = None) -> wire.Job:
        return await jobs.wait_async(self, await self.get_job(job_id), timeout, on_phase)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
