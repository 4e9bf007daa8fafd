"""E2B-style sandboxes over the daemon API: `Sandbox.create(template=...)` forks one child of a snapshot,
`Sandbox.create(pool=...)` claims a warm one.

    with Sandbox.create(template="base") as sb:
        print(sb.commands.run("echo hi").stdout)
        sb.files.write("/root/a.txt", "data")
        print(sb.eval("1 + 1").result)
        snap = sb.branch("step-1")          # a forkable snapshot of this sandbox, now
    # killed on exit (a kill that fails is raised, or noted on the exception already in flight)

`AsyncSandbox` is the same with `await` (and `async with`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from forkd_client.files import AsyncFilesystem, Filesystem

from forkd.base.errors import NotFound
from forkd.client import wire
from forkd.sdk.commands import ProcessCommands
from forkd.sdk.controller import AsyncController, Controller

log = logging.getLogger("forkd.sdk")


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


def _argv(cmd: str | list[str]) -> list[str]:
    return ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _pick(template: str | None, pool: str | None) -> None:
    if (template is None) == (pool is None):
        raise ValueError("Sandbox.create needs exactly one of template= (a snapshot tag) or pool= (a pool name)")


class Commands:
    def __init__(self, sb: Sandbox):
        self._sb = sb

    def run(self, cmd: str | list[str], timeout: float = 60, cwd: str | None = None,
            envs: dict[str, str] | None = None, stdin: str | None = None) -> wire.ExecResult:
        """Run a command (a string goes through /bin/sh -c) in a fresh guest process: {stdout, stderr, exit_code}."""
        return self._sb.controller.exec_command(self._sb.id, _argv(cmd), timeout, cwd=cwd, env=envs, stdin=stdin)


class Sandbox:
    def __init__(self, info: wire.SandboxInfo, controller: Controller, owned: bool = True):
        self.info, self.controller, self.owned = info, controller, owned
        self.commands, self.files = ProcessCommands(self), Filesystem(self)  # forkd/sdk/commands.py, files.py

    @property
    def id(self) -> str:
        return self.info.id

    sandbox_id = id

    @classmethod
    def create(cls, template: str | None = None, pool: str | None = None, *, controller: Controller | None = None,
               url: str | None = None, token: str | None = None, socket: str | Path | None = None,
               timeout: float | None = None, metadata: dict[str, str] | None = None) -> Sandbox:
        """`timeout`: seconds it lives (default: the daemon's FORKD_SANDBOX_TIMEOUT; extend with set_timeout);
        `metadata`: labels shown in list/get (Sandbox.list(metadata=...) filters by them; not for pool claims)."""
        _pick(template, pool)
        ctrl = controller or Controller(url=url, token=token, socket=socket)
        if pool:
            info = ctrl.claim(pool, 1)[0]
            info = ctrl.set_sandbox_timeout(info.id, timeout) if timeout else info
        else:
            info = ctrl.spawn_sandboxes(template, 1, lifetime_secs=timeout, labels=metadata)[0]
        return cls(info, ctrl)

    @classmethod
    def list(cls, *, metadata: dict[str, str] | None = None, controller: Controller | None = None,
             url: str | None = None, token: str | None = None, socket: str | Path | None = None) -> list:
        """The daemon's sandboxes (wire.SandboxInfo), only those labelled with all of `metadata` if given."""
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

    def fork(self, n: int = 1, *, keep: bool = False, tag: str | None = None,
             timeout: float | None = None) -> list[Sandbox]:
        """`n` new sandboxes continuing from this instant (a live branch; this one keeps running). The branch
        snapshot is removed when the last of them is killed, unless `keep` or `tag`."""
        infos = self.controller.fork_sandbox(self.id, n, tag=tag, keep=keep, lifetime_secs=timeout)
        return [type(self)(info, self.controller) for info in infos]

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

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, snapshot={self.info.snapshot_tag!r})"


class AsyncCommands:
    def __init__(self, sb: AsyncSandbox):
        self._sb = sb

    async def run(self, cmd: str | list[str], timeout: float = 60, cwd: str | None = None,
                  envs: dict[str, str] | None = None, stdin: str | None = None) -> wire.ExecResult:
        return await self._sb.controller.exec_command(self._sb.id, _argv(cmd), timeout, cwd=cwd, env=envs,
                                                      stdin=stdin)


class AsyncSandbox:
    def __init__(self, info: wire.SandboxInfo, controller: AsyncController, owned: bool = True):
        self.info, self.controller, self.owned = info, controller, owned
        self.commands, self.files = AsyncCommands(self), AsyncFilesystem(self)

    @property
    def id(self) -> str:
        return self.info.id

    sandbox_id = id

    @classmethod
    async def create(cls, template: str | None = None, pool: str | None = None, *,
                     controller: AsyncController | None = None, url: str | None = None, token: str | None = None,
                     socket: str | Path | None = None, timeout: float | None = None,
                     metadata: dict[str, str] | None = None) -> AsyncSandbox:
        _pick(template, pool)
        ctrl = controller or AsyncController(url=url, token=token, socket=socket)
        if pool:
            info = (await ctrl.claim(pool, 1))[0]
            info = await ctrl.set_sandbox_timeout(info.id, timeout) if timeout else info
        else:
            info = (await ctrl.spawn_sandboxes(template, 1, lifetime_secs=timeout, labels=metadata))[0]
        return cls(info, ctrl)

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

    async def kill(self) -> None:
        await self.controller.kill_sandbox(self.id)

    async def set_timeout(self, timeout: float) -> None:
        self.info = await self.controller.set_sandbox_timeout(self.id, timeout)

    async def fork(self, n: int = 1, *, keep: bool = False, tag: str | None = None,
                   timeout: float | None = None) -> list[AsyncSandbox]:
        infos = await self.controller.fork_sandbox(self.id, n, tag=tag, keep=keep, lifetime_secs=timeout)
        return [type(self)(info, self.controller) for info in infos]

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.owned:
            try:
                await self.kill()
            except Exception as error:  # noqa: BLE001 - reported by _kill_failed, never swallowed
                _kill_failed(self.id, exc, error)
