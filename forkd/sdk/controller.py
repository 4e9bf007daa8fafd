"""`Controller` / `AsyncController`: clients of the daemon's REST API with upstream forkd's method names.

Where the daemon is, first match wins: `url=` / `socket=` arguments, `$FORKD_URL` (TCP, with `$FORKD_TOKEN`), the
local daemon's unix socket ($FORKD_HOME/forkd.sock) if it exists, else upstream's default http://127.0.0.1:8889.

Every method is written once in `_Api`: it describes the request and `_send` performs it, synchronously in
`Controller` and as a coroutine in `AsyncController` (so `await actrl.list_sandboxes()` works the same way).
Results are the pydantic models of forkd.client.wire, which the server uses too; they also allow dict access
(`sb["id"]`) like upstream's dicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from pydantic import TypeAdapter

from forkd.base.settings import settings
from forkd.client import wire

DEFAULT_URL = "http://127.0.0.1:8889"


class ControllerError(RuntimeError):
    """A non-2xx answer. `status` is the HTTP code, `body` the parsed problem+json, `detail` its message."""

    def __init__(self, status: int, body: Any, url: str):
        self.status, self.body, self.url = status, body, url
        self.detail = body.get("detail") if isinstance(body, dict) else str(body)
        self.hint = body.get("hint") if isinstance(body, dict) else None
        super().__init__(f"{url}: HTTP {status}: {self.detail}" + (f" (hint: {self.hint})" if self.hint else ""))


def _endpoint(url: str | None, socket: str | None, token: str | None) -> tuple[str, str | None, str | None]:
    """(base_url, unix socket or None, token)."""
    token = token if token is not None else settings().token_value
    if url:
        return url.rstrip("/"), None, token
    if socket:
        return "http://forkd", str(socket), token
    url = settings().url
    if url:
        return url.rstrip("/"), None, token
    sock = settings().home / "forkd.sock"
    if sock.exists():
        return "http://forkd", str(sock), token
    return DEFAULT_URL, None, token


class _Req:
    __slots__ = ("method", "path", "json", "params", "content", "parse", "raw")

    def __init__(self, method: str, path: str, json: Any = None, params: dict | None = None,
                 content: bytes | None = None, parse: Any = None, raw: bool = False):
        self.method, self.path, self.json, self.params = method, path, json, params
        self.content, self.parse, self.raw = content, parse, raw


_SNAPS = TypeAdapter(list[wire.SnapshotInfo])
_SBXS = TypeAdapter(list[wire.SandboxInfo])


def _result(req: _Req, r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            body = r.text
        raise ControllerError(r.status_code, body, str(r.request.url))
    if req.raw:
        return r.content
    if not r.content:
        return None
    data = r.json()
    if req.parse is None:
        return data
    if isinstance(req.parse, TypeAdapter):
        return req.parse.validate_python(data)
    return req.parse(data)


def _q(s: str) -> str:
    return httpx.URL(f"/{s}").raw_path.decode()[1:]  # percent-encode one path segment


class _Api:
    def _send(self, req: _Req) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    # -- status ----------------------------------------------------------------------------------------
    def healthz(self) -> dict:
        return self._send(_Req("GET", "/healthz"))

    def version(self) -> dict:
        return self._send(_Req("GET", "/version"))

    # -- snapshots (upstream names) ------------------------------------------------------------------
    def list_snapshots(self) -> list[wire.SnapshotInfo]:
        return self._send(_Req("GET", "/v1/snapshots", parse=_SNAPS))

    def get_snapshot(self, tag: str) -> wire.SnapshotInfo:
        return self._send(_Req("GET", f"/v1/snapshots/{_q(tag)}", parse=wire.SnapshotInfo.model_validate))

    def snapshot_info(self, tag: str) -> wire.SnapshotDetail:
        return self._send(_Req("GET", f"/v1/snapshots/{_q(tag)}/info", parse=wire.SnapshotDetail.model_validate))

    def create_snapshot(self, tag: str, memory_mib: int = 512, vcpus: int = 1, warm_imports: list[str] = (),
                        warm_run: list[str] = (), warm_exec: list[str] = (),
                        from_tag: str | None = None) -> wire.SnapshotInfo:
        body = wire.CreateSnapshotRequest(tag=tag, memory_mib=memory_mib, vcpus=vcpus,
                                          warm_imports=list(warm_imports), warm_run=list(warm_run),
                                          warm_exec=list(warm_exec), from_tag=from_tag)
        return self._send(_Req("POST", "/v1/snapshots", json=body.model_dump(exclude_none=True),
                               parse=wire.SnapshotInfo.model_validate))

    def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        params = {k: "true" for k, v in (("cascade", cascade), ("force", force)) if v}
        return self._send(_Req("DELETE", f"/v1/snapshots/{_q(tag)}", params=params))

    def compact_snapshot(self, tag: str, to: str) -> wire.SnapshotInfo:
        return self._send(_Req("POST", f"/v1/snapshots/{_q(tag)}/compact", json={"to": to},
                               parse=wire.SnapshotInfo.model_validate))

    # -- sandboxes (upstream names) ------------------------------------------------------------------
    def spawn_sandboxes(self, snapshot_tag: str, n: int = 1, per_child_netns: bool = False,
                        memory_limit_mib: int | None = None) -> list[wire.SandboxInfo]:
        body: dict[str, Any] = {"snapshot_tag": snapshot_tag, "n": n, "per_child_netns": per_child_netns}
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = memory_limit_mib
        return self._send(_Req("POST", "/v1/sandboxes", json=body, parse=_SBXS))

    def list_sandboxes(self) -> list[wire.SandboxInfo]:
        return self._send(_Req("GET", "/v1/sandboxes", parse=_SBXS))

    def get_sandbox(self, sandbox_id: str) -> wire.SandboxInfo:
        return self._send(_Req("GET", f"/v1/sandboxes/{_q(sandbox_id)}", parse=wire.SandboxInfo.model_validate))

    def kill_sandbox(self, sandbox_id: str) -> None:
        return self._send(_Req("DELETE", f"/v1/sandboxes/{_q(sandbox_id)}"))

    def branch_sandbox(self, sandbox_id: str, tag: str | None = None, mode: str = "live",
                       wait: bool = True) -> wire.BranchResult:
        body: dict[str, Any] = {"mode": mode, "wait": wait}
        if tag is not None:
            body["tag"] = tag
        return self._send(_Req("POST", f"/v1/sandboxes/{_q(sandbox_id)}/branch", json=body,
                               parse=wire.BranchResult.model_validate))

    def exec_command(self, sandbox_id: str, args: list[str], timeout_secs: float = 30, cwd: str | None = None,
                     env: dict[str, str] | None = None, stdin: str | None = None) -> wire.ExecResult:
        body = wire.ExecRequest(args=list(args), timeout_secs=timeout_secs, cwd=cwd, env=env, stdin=stdin)
        return self._send(_Req("POST", f"/v1/sandboxes/{_q(sandbox_id)}/exec",
                               json=body.model_dump(exclude_none=True), parse=wire.ExecResult.model_validate))

    def eval_code(self, sandbox_id: str, code: str, timeout_secs: float = 60, mode: str = "eval") -> wire.EvalResult:
        return self._send(_Req("POST", f"/v1/sandboxes/{_q(sandbox_id)}/eval",
                               json={"code": code, "timeout_secs": timeout_secs, "mode": mode},
                               parse=wire.EvalResult.model_validate))

    def ping_sandbox(self, sandbox_id: str) -> wire.PingResult:
        return self._send(_Req("POST", f"/v1/sandboxes/{_q(sandbox_id)}/ping", parse=wire.PingResult.model_validate))

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._send(_Req("GET", f"/v1/sandboxes/{_q(sandbox_id)}/files", params={"path": path}, raw=True))

    def write_file(self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644) -> wire.FileWritten:
        content = data.encode() if isinstance(data, str) else bytes(data)
        return self._send(_Req("PUT", f"/v1/sandboxes/{_q(sandbox_id)}/files", params={"path": path, "mode": mode},
                               content=content, parse=wire.FileWritten.model_validate))

    # -- forkd's own -----------------------------------------------------------------------------------
    def claim(self, pool: str, n: int = 1) -> list[wire.SandboxInfo]:
        """Hand out `n` warm children of a pool (forked on the spot if fewer are warm)."""
        return self._send(_Req("POST", f"/v1/pools/{_q(pool)}/claim", json={"n": n},
                               parse=lambda d: _SBXS.validate_python(d["sandboxes"])))

    def apply(self, docs: list[dict] | str, applyset: str = "sdk", prune: bool = False,
              manager: str = "sdk", force: bool = False) -> list[dict]:
        """Apply declarative documents (dicts, or a YAML string with `---` separators); returns the changes."""
        if isinstance(docs, str):
            import yaml

            docs = [d for d in yaml.safe_load_all(docs) if d]
        items = [{"document": d, "source": "sdk"} for d in docs]
        return self._send(_Req("POST", "/v1/apply", json={"items": items, "applyset": applyset, "prune": prune,
                                                          "manager": manager, "force": force},
                               parse=lambda d: d["changes"]))

    def list_pools(self) -> list[dict]:
        return self._send(_Req("GET", "/v1/pools"))

    def get_pool(self, name: str) -> dict:
        return self._send(_Req("GET", f"/v1/pools/{_q(name)}"))

    def delete_pool(self, name: str) -> None:
        return self._send(_Req("DELETE", f"/v1/pools/{_q(name)}"))

    def wait(self, targets: list[tuple[str, str]], timeout: float = 300) -> dict:
        """Block until the named objects are Ready, e.g. [("ForkPool", "agents")]: {ok, problems}."""
        return self._send(_Req("POST", "/v1/wait", json={"targets": [list(t) for t in targets], "timeout": timeout}))


class Controller(_Api):
    """Synchronous client. `Controller()` finds the daemon as described in the module docstring."""

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0):
        self.base_url, self.socket, self.token = _endpoint(url, str(socket) if socket else None, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        transport = httpx.HTTPTransport(uds=self.socket) if self.socket else None
        self._http = httpx.Client(base_url=self.base_url, transport=transport, headers=headers, timeout=timeout)

    def _send(self, req: _Req) -> Any:
        r = self._http.request(req.method, req.path, json=req.json, params=req.params, content=req.content)
        return _result(req, r)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncController(_Api):
    """The same methods as Controller, as coroutines (httpx.AsyncClient)."""

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0):
        self.base_url, self.socket, self.token = _endpoint(url, str(socket) if socket else None, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        transport = httpx.AsyncHTTPTransport(uds=self.socket) if self.socket else None
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport, headers=headers, timeout=timeout)

    async def _send(self, req: _Req) -> Any:
        r = await self._http.request(req.method, req.path, json=req.json, params=req.params, content=req.content)
        return _result(req, r)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncController:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def dumps(obj: Any) -> str:
    """JSON of a result (models or plain data), for printing."""
    if isinstance(obj, list):
        return json.dumps([o.model_dump(mode="json") if hasattr(o, "model_dump") else o for o in obj])
    return json.dumps(obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj)
