"""The two backends behind every front end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import httpx

from forkd.base.errors import Conflict, ForkdError, InvalidInput, NotFound
from forkd.base.paths import Layout
from forkd.base.settings import settings
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Change, Control
from forkd.spec.models import MODELS, ForkObject, to_document

ObjList = list[tuple[ForkObject, str]]


class Backend(Protocol):
    def apply(self, objs: ObjList, applyset: str, prune: bool = False, dry_run: bool = False,
              manager: str = "cli", force: bool = False) -> list[Change]: ...
    def diff(self, objs: ObjList) -> list[tuple[str, str]]: ...
    def get(self, kind: str, name: str | None = None) -> list[ForkObject]: ...
    def describe(self, kind: str, name: str) -> dict[str, Any]: ...
    def delete(self, kind: str, name: str) -> None: ...
    def claim(self, pool: str, n: int = 1) -> list[dict[str, Any]]: ...
    def wait(self, targets: list[tuple[str, str]], timeout: float,
             progress: Callable[[str], None] = lambda s: None) -> tuple[bool, list[str]]: ...


def child_view(rec) -> dict[str, Any]:
    return dict(rec.to_json(), status=rec.status, agent_socket=str(rec.agent_socket))


class LocalBackend:
    """In-process: the caller's own Control (and, for `wait`, its own reconcile loop)."""

    def __init__(self, control: Control | None = None):
        self.control = control or Control(Runtime())

    def apply(self, objs, applyset, prune=False, dry_run=False, manager="cli", force=False):
        return self.control.apply(objs, applyset, prune=prune, dry_run=dry_run, manager=manager, force=force)

    def diff(self, objs):
        return self.control.diff(objs)

    def get(self, kind, name=None):
        return self.control.get(kind, name)

    def describe(self, kind, name):
        return self.control.describe(kind, name)

    def delete(self, kind, name):
        self.control.delete(kind, name)

    def claim(self, pool, n=1):
        return [child_view(r) for r in self.control.claim(pool, n)]

    def wait(self, targets, timeout, progress=lambda s: None):
        return self.control.reconciler.run_until_converged(timeout, targets, progress)


_ERRORS = {400: InvalidInput, 401: InvalidInput, 404: NotFound, 409: Conflict, 422: InvalidInput}


class RemoteBackend:
    """A running `forkd serve`, over its unix socket, or over TCP (`url`, with a bearer `token`)."""

    def __init__(self, socket_path: str | None = None, timeout: float = 600.0, url: str | None = None,
                 token: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if url:
            self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers=headers)
        else:
            self.http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://forkd",
                                     timeout=timeout, headers=headers)

    def _call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ForkdError(f"daemon request {method} {path} failed: {exc}") from exc
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"detail": r.text}
            raise _ERRORS.get(r.status_code, ForkdError)(body.get("detail") or str(body), hint=body.get("hint"))
        return r.json() if r.content else None

    @staticmethod
    def _docs(objs: ObjList) -> list[dict]:
        return [{"document": to_document(o, with_status=False), "source": src} for o, src in objs]

    def apply(self, objs, applyset, prune=False, dry_run=False, manager="cli", force=False):
        res = self._call("POST", "/v1/apply", json={"items": self._docs(objs), "applyset": applyset,
                                                   "prune": prune, "dry_run": dry_run, "manager": manager,
                                                   "force": force})
        return [Change(**c) for c in res["changes"]]

    def diff(self, objs):
        return [tuple(x) for x in self._call("POST", "/v1/diff", json={"items": self._docs(objs)})["diffs"]]

    def get(self, kind, name=None):
        docs = self._call("GET", f"/v1/objects/{kind}" + (f"/{name}" if name else ""))["items"]
        return [MODELS[d["kind"]].model_validate(d) for d in docs]

    def describe(self, kind, name):
        return self._call("GET", f"/v1/objects/{kind}/{name}/describe")

    def delete(self, kind, name):
        self._call("DELETE", f"/v1/objects/{kind}/{name}")

    def claim(self, pool, n=1):
        return self._call("POST", f"/v1/pools/{pool}/claim", json={"n": n})["children"]

    def wait(self, targets, timeout, progress=lambda s: None):
        res = self._call("POST", "/v1/wait", json={"targets": targets, "timeout": timeout},
                         timeout=timeout + 30)
        return res["ok"], res["problems"]


def daemon_socket(layout: Layout | None = None) -> str | None:
    """The daemon's socket if a daemon answers on it."""
    path = (layout or Layout.from_env()).daemon_socket
    if not path.exists():
        return None
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=2.0) as c:
            if c.get("http://forkd/healthz").status_code == 200:
                return str(path)
    except httpx.HTTPError:
        return None
    return None


def backend() -> Backend:
    """FORKD_URL (+ FORKD_TOKEN) names a daemon on TCP; else the local daemon's socket if one answers; else
    in-process (FORKD_NO_DAEMON=1 forces that)."""
    s = settings()
    if s.url and not s.no_daemon:
        return RemoteBackend(url=s.url, token=s.token_value)
    if not s.no_daemon:
        sock = daemon_socket()
        if sock:
            return RemoteBackend(sock)
    return LocalBackend()
