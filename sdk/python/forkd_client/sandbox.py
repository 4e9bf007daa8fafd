"""E2B-style sandboxes over the daemon API: `Sandbox.create(template=...)` forks one child of a snapshot,
`Sandbox.create(pool=...)` claims a warm one.

    with Sandbox.create(template="base", timeout=600, metadata={"run": "7"}, egress="internet") as sb:
        print(sb.commands.run("echo hi").stdout)          # streaming commands: forkd_client.commands
        sb.files.write("/root/a.txt", "data")             # the filesystem: forkd_client.files
        print(sb.eval("1 + 1").result)
        snap = sb.branch("step-1")                        # a forkable snapshot of this sandbox, now
        kids = sb.fork(3)                                 # 3 running sandboxes continuing from this instant
        sb.set_timeout(300)                               # keepalive
        url = sb.get_url(8000)                            # through the daemon to the sandbox's port 8000
    # killed on exit (a kill that fails is raised, or noted on the exception already in flight)
    Sandbox.list(metadata={"run": "7"})

`AsyncSandbox` is the same with `await` (and `async with`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from forkd_client import models as wire
from forkd_client.api import AsyncClient as AsyncController
from forkd_client.api import Client as Controller
from forkd_client.async_commands import AsyncProcessCommands
from forkd_client.commands import ProcessCommands
from forkd_client.errors import NotFound
from forkd_client.files import AsyncFilesystem, Filesystem

log = logging.getLogger("forkd_client")
Labels = dict[str, str]


def _kill_failed(sandbox_id: str, in_flight: BaseException | None, error: Exception) -> None:
    """A kill that failed on leaving a `with` block is never swallowed: a sandbox already gone (NotFound) is fine;
    otherwise the failure is raised when no other exception is in flight, else it becomes a note on the one in
    flight (and a warning in the log), which propagates unchanged."""
    if isinstance(error, NotFound):
        return
    what = (f"killing sandbox {sandbox_id} on leaving its `with` block failed ({type(error).__name__}: {error}); "
            f"it may still be running: kill it with Sandbox.connect({sandbox_id!r}).kill() or 'forkd kill "
            f"{sandbox_id}'")
    if in_flight is None:
        error.add_note(what)
        raise error
    in_flight.add_note(what)
    log.warning("%s", what)


def _pick(template: str | None, pool: str | None) -> None:
    if (template is None) == (pool is None):
        raise ValueError("Sandbox.create needs exactly one of template= (a snapshot tag) or pool= (a pool name)")


def egress_of(egress: wire.Egress | None, allow_internet_access: bool | None,
              pool: str | None) -> wire.Egress | None:
    """What Sandbox.create sends as egress. Unlike E2B, a sandbox reaches nothing unless asked:
    `allow_internet_access=True` (E2B's name) is egress "internet", False is "none"; `egress` says it in forkd's
    terms ("none", "internet", {"allow": ["CIDR:port", ...]}). A pool's children have the pool's egress."""
    if allow_internet_access is not None:
        if egress is not None:
            raise ValueError("Sandbox.create takes egress= or allow_internet_access=, not both")
        egress = "internet" if allow_internet_access else "none"
    if pool is not None and egress is not None:
        raise ValueError(f"a sandbox claimed from pool {pool!r} has the pool's egress (its child.egress): "
                         "leave egress= and allow_internet_access= unset, or use template=")
    return egress


class _Sandbox:
    """What Sandbox and AsyncSandbox share: the sandbox's record (`info`), its daemon client (`controller`), the envs
    every command gets, whether leaving a `with` block kills it (`owned`), and its `commands` and `files`."""

    _parts: tuple[type, type]  # the classes of `commands` and `files`

    def __init__(self, info: wire.SandboxInfo, controller: Any, owned: bool = True,
                 envs: dict[str, str] | None = None):
        self.info, self.controller, self.owned, self.envs = info, controller, owned, dict(envs or {})
        self._urls: dict[int, str] = {}  # port -> the URL this object opened (the daemon shows a token once)
        commands, files = self._parts
        self.commands, self.files = commands(self), files(self)

    @property
    def metadata(self) -> Labels:
        return dict(self.info.labels)

    @property
    def id(self) -> str:
        return self.info.id

    sandbox_id = id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, snapshot={self.info.snapshot_tag!r})"


class Sandbox(_Sandbox):
    _parts = (ProcessCommands, Filesystem)
    controller: Controller

    @classmethod
    def create(cls, template: str | None = None, pool: str | None = None, *, envs: dict[str, str] | None = None,
               metadata: Labels | None = None, timeout: float | None = None, egress: wire.Egress | None = None,
               allow_internet_access: bool | None = None, controller: Controller | None = None,
               url: str | None = None, token: str | None = None, socket: str | Path | None = None) -> Sandbox:
        """Fork a child of snapshot `template`, or claim one of `pool`. `envs`: set in every command it runs
        (a call's own envs win). `metadata`: the sandbox's labels (`Sandbox.list(metadata=...)` filters on them;
        not for pool claims). `timeout`: seconds it lives (default: a pool's child.ttlSeconds, else the daemon's
        FORKD_SANDBOX_TIMEOUT; extend with set_timeout). `egress` / `allow_internet_access`: what it may reach
        on the network (egress_of; default nothing; the template must be built with network isolated)."""
        _pick(template, pool)
        egress = egress_of(egress, allow_internet_access, pool)
        ctrl = controller or Controller(url=url, token=token, socket=socket)
        if pool:
            info = ctrl.claim(pool, 1, lifetime_secs=timeout)[0]
        else:
            info = ctrl.spawn_sandboxes(template, 1, lifetime_secs=timeout, labels=metadata, egress=egress)[0]
        return cls(info, ctrl, envs=envs)

    @classmethod
    def list(cls, metadata: Labels | None = None, *, controller: Controller | None = None, url: str | None = None,
             token: str | None = None, socket: str | Path | None = None) -> list[wire.SandboxInfo]:
        """The daemon's sandboxes, only those labelled with every `metadata` pair when given."""
        ctrl = controller or Controller(url=url, token=token, socket=socket)
        return ctrl.list_sandboxes(labels=metadata)

    @classmethod
    def connect(cls, sandbox_id: str, *, controller: Controller | None = None, url: str | None = None,
                token: str | None = None, socket: str | Path | None = None) -> Sandbox:
        """Attach to a running sandbox; leaving a `with` block does not kill it."""
        ctrl = controller or Controller(url=url, token=token, socket=socket)
        return cls(ctrl.get_sandbox(sandbox_id), ctrl, owned=False)

    def eval(self, code: str, timeout: float = 60) -> wire.EvalResult:
        """Evaluate an expression in the warm interpreter (PID 1's agent): `.result` is its repr."""
        return self.controller.eval_code(self.id, code, timeout)

    def run_code(self, code: str, timeout: float = 300) -> wire.EvalResult:
        """Execute statements in the warm interpreter (state persists between calls)."""
        return self.controller.eval_code(self.id, code, timeout, mode="exec")

    def ping(self) -> wire.PingResult:
        return self.controller.ping_sandbox(self.id)

    def branch(self, tag: str | None = None, mode: str = "live", wait: bool = True) -> wire.BranchResult:
        """Snapshot this running sandbox as `tag`; spawn from it with Sandbox.create(template=tag)."""
        return self.controller.branch_sandbox(self.id, tag, mode, wait)

    def get_info(self) -> wire.SandboxInfo:
        self.info = self.controller.get_sandbox(self.id)
        return self.info

    def set_timeout(self, timeout: float) -> None:
        """Keepalive: this sandbox now lives `timeout` seconds from now (the daemon kills it then)."""
        self.info = self.controller.set_sandbox_timeout(self.id, timeout)

    def fork(self, n: int = 1, *, keep: bool = False, tag: str | None = None, timeout: float | None = None,
             egress: wire.Egress | None = None) -> list[Sandbox]:
        """`n` new sandboxes continuing from this instant (a live branch; this one keeps running), with this one's
        envs and egress (unless `egress` says otherwise). The branch snapshot is removed when the last of them is
        killed, unless `keep` or `tag`."""
        infos = self.controller.fork_sandbox(self.id, n, tag=tag, keep=keep, lifetime_secs=timeout, egress=egress)
        return [type(self)(info, self.controller, envs=self.envs) for info in infos]

    def get_url(self, port: int) -> str:
        """A URL through the daemon to TCP `port` in this sandbox (its server's root), carrying a token for that
        port of this sandbox only; it stops working at close_port(port) or when the sandbox dies. The first call
        for a port opens it, later ones give the same URL (the daemon shows a token only once). Over the unix
        socket the host is a placeholder: send with this client's transport."""
        if port not in self._urls:
            grant = self.controller.open_port(self.id, port)
            self._urls[port] = self.controller.base_url.rstrip("/") + grant.path
        return self._urls[port]

    def get_host(self, port: int) -> str:
        """E2B's get_host: get_url without its scheme (host[:port]/v1/ports/...); prefix the daemon's scheme."""
        return self.get_url(port).split("://", 1)[1]

    def close_port(self, port: int) -> None:
        """Revoke every grant of `port` of this sandbox (whoever opened it): their URLs stop working."""
        self._urls.pop(port, None)
        self.controller.close_port(self.id, port)

    def kill(self) -> None:
        self.controller.kill_sandbox(self.id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.owned:
            try:
                self.kill()
            except Exception as error:  # noqa: BLE001 - reported by _kill_failed, never swallowed
                _kill_failed(self.id, exc, error)


class AsyncSandbox(_Sandbox):
    _parts = (AsyncProcessCommands, AsyncFilesystem)
    controller: AsyncController

    @classmethod
    async def create(cls, template: str | None = None, pool: str | None = None, *,
                     envs: dict[str, str] | None = None, metadata: Labels | None = None,
                     timeout: float | None = None, egress: wire.Egress | None = None,
                     allow_internet_access: bool | None = None, controller: AsyncController | None = None,
                     url: str | None = None, token: str | None = None,
                     socket: str | Path | None = None) -> AsyncSandbox:
        _pick(template, pool)
        egress = egress_of(egress, allow_internet_access, pool)
        ctrl = controller or AsyncController(url=url, token=token, socket=socket)
        if pool:
            info = (await ctrl.claim(pool, 1, lifetime_secs=timeout))[0]
        else:
            info = (await ctrl.spawn_sandboxes(template, 1, lifetime_secs=timeout, labels=metadata,
                                               egress=egress))[0]
        return cls(info, ctrl, envs=envs)

    @classmethod
    async def list(cls, metadata: Labels | None = None, *, controller: AsyncController | None = None,
                   url: str | None = None, token: str | None = None,
                   socket: str | Path | None = None) -> list[wire.SandboxInfo]:
        ctrl = controller or AsyncController(url=url, token=token, socket=socket)
        return await ctrl.list_sandboxes(labels=metadata)

    @classmethod
    async def connect(cls, sandbox_id: str, *, controller: AsyncController | None = None, url: str | None = None,
                      token: str | None = None, socket: str | Path | None = None) -> AsyncSandbox:
        ctrl = controller or AsyncController(url=url, token=token, socket=socket)
        return cls(await ctrl.get_sandbox(sandbox_id), ctrl, owned=False)

    async def eval(self, code: str, timeout: float = 60) -> wire.EvalResult:
        return await self.controller.eval_code(self.id, code, timeout)

    async def run_code(self, code: str, timeout: float = 300) -> wire.EvalResult:
        return await self.controller.eval_code(self.id, code, timeout, mode="exec")

    async def ping(self) -> wire.PingResult:
        return await self.controller.ping_sandbox(self.id)

    async def branch(self, tag: str | None = None, mode: str = "live", wait: bool = True) -> wire.BranchResult:
        return await self.controller.branch_sandbox(self.id, tag, mode, wait)

    async def get_info(self) -> wire.SandboxInfo:
        self.info = await self.controller.get_sandbox(self.id)
        return self.info

    async def set_timeout(self, timeout: float) -> None:
        self.info = await self.controller.set_sandbox_timeout(self.id, timeout)

    async def fork(self, n: int = 1, *, keep: bool = False, tag: str | None = None, timeout: float | None = None,
                   egress: wire.Egress | None = None) -> list[AsyncSandbox]:
        infos = await self.controller.fork_sandbox(self.id, n, tag=tag, keep=keep, lifetime_secs=timeout,
                                                   egress=egress)
        return [type(self)(info, self.controller, envs=self.envs) for info in infos]

    async def get_url(self, port: int) -> str:
        if port not in self._urls:
            grant = await self.controller.open_port(self.id, port)
            self._urls[port] = self.controller.base_url.rstrip("/") + grant.path
        return self._urls[port]

    async def get_host(self, port: int) -> str:
        return (await self.get_url(port)).split("://", 1)[1]

    async def close_port(self, port: int) -> None:
        self._urls.pop(port, None)
        await self.controller.close_port(self.id, port)

    async def kill(self) -> None:
        await self.controller.kill_sandbox(self.id)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.owned:
            try:
                await self.kill()
            except Exception as error:  # noqa: BLE001 - reported by _kill_failed, never swallowed
                _kill_failed(self.id, exc, error)
