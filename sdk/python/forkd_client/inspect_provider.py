"""The `forkd` sandbox provider of Inspect AI: each sample runs in its own forkd child, forked copy-on-write from
a warm snapshot (or claimed from a ForkPool) through a running forkd daemon.

    Task(..., sandbox="forkd")                        # every sample forks the snapshot `base`
    Task(..., sandbox=("forkd", "forkd.yaml"))        # template/pool, per-task setup, user, workdir: inspect_config

Inspect finds it through the `inspect_ai` entry point of the forkd-client distribution. `task_init` checks the
template in one probe child (the user exists, the working directory too) and, when the config has `setup`
commands, runs them there once and branches that child into a per-task snapshot the samples fork from.
`exec` streams through the daemon's process API (stdin sent while output is read; the daemon kills the process
group at `timeout`); `write_file`/`read_file` run as the sandbox's user (so file permissions hold for them) and
name the file in their errors. docs/inspect.md says what is not supported."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    sandboxenv,
)
from pydantic import BaseModel

from forkd_client.api import AsyncClient, Client
from forkd_client.errors import ForkdError, NotFound
from forkd_client.http import Call
from forkd_client.inspect_config import (
    PROVIDER,
    PROVIDER_LABEL,
    TASK_LABEL,
    TASK_PREFIX,
    ForkdSandboxConfig,
    load_config,
    slug,
)
from forkd_client.inspect_exec import Outcome, run_streamed
from forkd_client.sandbox import AsyncSandbox

SAFE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the file calls' own commands
WRITE = SAFE_PATH + '; d=$(dirname -- "$1") && mkdir -p -- "$d" && cat > "$1"'
READ = SAFE_PATH + ('; if [ -d "$1" ]; then echo "$1: Is a directory" >&2; exit 1; fi'
                    '; n=$(stat -L -c %s -- "$1") || exit 1'
                    '; if [ "$n" -gt "$2" ]; then echo "forkd-read-limit $n" >&2; exit 3; fi; exec cat -- "$1"')
HOME_PROBE = 'cd -- "${1:-$HOME}" && pwd'
CHILD_MIB = 256  # what default_concurrency budgets per sample (children share their snapshot's pages)


class _Task:
    """What task_init made for one (task, config): the snapshot samples fork from, its working directory, and
    the per-task snapshot to remove at task_cleanup (None when samples fork the configured template)."""

    def __init__(self, cfg: ForkdSandboxConfig, template: str | None, workdir: str, branched: str | None):
        self.cfg, self.template, self.workdir, self.branched = cfg, template, workdir, branched


_TASKS: dict[tuple[str, str], _Task] = {}


def _controller(cfg: ForkdSandboxConfig) -> AsyncClient:
    return AsyncClient(url=cfg.url, token=cfg.token, socket=cfg.socket)


def _labels(task_name: str) -> dict[str, str]:
    return {PROVIDER_LABEL: PROVIDER, TASK_LABEL: slug(task_name, 63)}


async def _new_child(cfg: ForkdSandboxConfig, template: str | None, task_name: str,
                     ctrl: AsyncClient) -> AsyncSandbox:
    """One child: forked from `template`, or claimed from the config's pool."""
    try:
        if cfg.pool:
            return await AsyncSandbox.create(pool=cfg.pool, timeout=cfg.lifetime_secs, controller=ctrl)
        info = (await ctrl.spawn_sandboxes(template or "base", 1, memory_limit_mib=cfg.memory_limit_mib,
                                           lifetime_secs=cfg.lifetime_secs, labels=_labels(task_name)))[0]
        return AsyncSandbox(info, ctrl)
    except NotFound as exc:
        raise RuntimeError(f"forkd sandbox: {cfg.source} not found on the daemon ({exc.message}); create it, e.g. "
                           f"`forkd snapshot create --tag {template or 'base'}`, or set `template:` in the "
                           "sandbox config") from None


@sandboxenv(name="forkd")
class ForkdSandboxEnvironment(SandboxEnvironment):
    """One sample's forkd child."""

    def __init__(self, sb: AsyncSandbox, user: str | None, workdir: str, lifetime: float | None = None):
        super().__init__()
        self.sb, self.user, self.workdir, self.lifetime = sb, user, workdir, lifetime

    # -- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return ForkdSandboxConfig.model_validate(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        """Samples at once: twice the CPUs, fewer if the daemon's node has less memory than CHILD_MIB each."""
        cpus = 2 * (os.cpu_count() or 1)
        try:
            with Client(timeout=5) as c:
                mib = c._send(Call("GET", "/v1/node"))["memoryAvailableMiB"]
        except (ForkdError, KeyError, TypeError, OSError):
            return cpus
        return max(1, min(cpus, int(mib) // CHILD_MIB))

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        cfg = load_config(config)
        key = (task_name, cfg.key())
        if key not in _TASKS:
            _TASKS[key] = await _prepare(task_name, cfg)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        cfg = load_config(config)
        task = _TASKS.get((task_name, cfg.key()))
        if task is None:  # a sample outside an eval's task_init (e.g. sandbox tools run by hand)
            await cls.task_init(task_name, cfg)
            task = _TASKS[(task_name, cfg.key())]
        sb = await _new_child(cfg, task.template, task_name, _controller(cfg))
        return {"default": cls(sb, cfg.user, task.workdir, cfg.lifetime_secs)}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, ForkdSandboxEnvironment):
                await env._kill()

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        cfg = load_config(config)
        task = _TASKS.pop((task_name, cfg.key()), None)
        if not cleanup:
            return
        ctrl = _controller(cfg)
        try:
            for info in await ctrl.list_sandboxes(labels=_labels(task_name)):
                await _kill_quietly(ctrl, info.id)
            if task is not None and task.branched:
                await ctrl.delete_snapshot(task.branched, force=True)
        finally:
            await ctrl.aclose()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup forkd [ID]`: kill that child, or every child and per-task snapshot the
        provider made (children labelled inspect.forkd.dev/provider=inspect, snapshots tagged inspect-task-*)."""
        ctrl = AsyncClient()
        try:
            if id is not None:
                await _kill_quietly(ctrl, id)
                return
            for info in await ctrl.list_sandboxes(labels={PROVIDER_LABEL: PROVIDER}):
                await _kill_quietly(ctrl, info.id)
            for snap in await ctrl.list_snapshots():
                if snap.tag.startswith(TASK_PREFIX):
                    await ctrl.delete_snapshot(snap.tag, force=True)
        finally:
            await ctrl.aclose()

    async def _kill(self) -> None:
        try:
            await _kill_quietly(self.sb.controller, self.sb.id)
        finally:
            await self.sb.controller.aclose()

    @asynccontextmanager
    async def fork(self, n: int = 2) -> AsyncIterator[list[ForkdSandboxEnvironment]]:
        """`n` sandboxes continuing from this instant of this one (a live branch; this one keeps running), for
        a solver to try `n` continuations; each is killed (and the branch removed) when the block ends.

            async with sandbox().as_type(ForkdSandboxEnvironment).fork(3) as tries:
                results = [await t.exec(["sh", "-c", step]) for t, step in zip(tries, steps)]
        """
        ctrl = self.sb.controller
        infos = await ctrl.fork_sandbox(self.sb.id, n, lifetime_secs=self.lifetime, labels=self.sb.info.labels)
        kids = [AsyncSandbox(info, ctrl, owned=False) for info in infos]
        try:
            yield [ForkdSandboxEnvironment(k, self.user, self.workdir, self.lifetime) for k in kids]
        finally:
            for k in kids:
                await _kill_quietly(self.sb.controller, k.id)

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        who = user or self.user
        return SandboxConnection(type="forkd", container=self.sb.id,
                                 command=f"forkd exec -it {'-u ' + who + ' ' if who else ''}{self.sb.id} -- /bin/sh")

    # -- commands and files ------------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        data = input.encode() if isinstance(input, str) else input
        got = await self._run(cmd, data, self._path(cwd) if cwd else self.workdir, env, user or self.user, timeout,
                              limit)
        if got.over_limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                                           got.stdout[:limit].decode("utf-8", "replace"))
        if got.pid is None and got.code == 126 and "permission denied" in got.stderr.decode(errors="replace").lower():
            raise PermissionError(errno.EACCES, f"cannot execute {cmd[0]} in sandbox {self.sb.id}", cmd[0])
        return ExecResult(success=got.code == 0, returncode=got.code, stdout=got.stdout.decode("utf-8", "replace"),
                          stderr=got.stderr.decode("utf-8", "replace"))

    async def _run(self, cmd: list[str], data: bytes | None, cwd: str, env: dict[str, str] | None,
                   user: str | None, timeout: float | None, limit: int) -> Outcome:
        try:
            got = await run_streamed(self.sb, cmd, data, cwd=cwd, env=env, user=user, timeout=timeout, limit=limit)
        except NotFound as exc:
            raise SandboxUnavailableError(f"forkd child {self.sb.id} is gone: {exc.message}") from None
        if got.broken is not None:
            raise SandboxUnavailableError(f"forkd child {self.sb.id}: the command's stream broke: {got.broken}")
        if got.timed_out:
            raise TimeoutError(f"command timed out after {timeout} seconds in forkd child {self.sb.id}: {cmd[:3]}")
        return got

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        got = await self._run(["/bin/sh", "-c", WRITE, "forkd-write", self._path(file)], data, self.workdir, None,
                              self.user, None, 64 << 10)
        if got.code != 0:
            raise _file_error(got, file, "write")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        got = await self._run(["/bin/sh", "-c", READ, "forkd-read", self._path(file), str(limit)], None,
                              self.workdir, None, self.user, None, limit)
        if got.over_limit or (got.code == 3 and got.stderr.startswith(b"forkd-read-limit")):
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        if got.code != 0:
            raise _file_error(got, file, "read")
        return got.stdout.decode("utf-8") if text else got.stdout


def _file_error(got: Outcome, file: str, verb: str) -> Exception:
    """The error Inspect expects for a failed file call, naming the file as the caller gave it."""
    said = got.stderr.decode("utf-8", "replace").strip()
    low = said.lower()
    if "no such file" in low or "not a directory" in low:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    if "permission denied" in low or "read-only file system" in low:
        return PermissionError(errno.EACCES, "Permission denied", file)
    if "is a directory" in low:
        return IsADirectoryError(errno.EISDIR, "Is a directory", file)
    return RuntimeError(f"forkd sandbox: cannot {verb} {file} (exit {got.code}): {said[-500:]}")


async def _kill_quietly(ctrl: AsyncClient, sandbox_id: str) -> None:
    try:
        await ctrl.kill_sandbox(sandbox_id)
    except NotFound:
        pass


async def _prepare(task_name: str, cfg: ForkdSandboxConfig) -> _Task:
    """One probe child of the template: run the setup, find the working directory, and branch it when setup
    changed it (samples then fork from that); the probe is killed either way."""
    ctrl = _controller(cfg)
    sb = await _new_child(cfg, cfg.template, task_name, ctrl)
    try:
        for cmd in cfg.setup:
            res = await sb.commands.run(cmd, timeout=cfg.setup_timeout, user="root")
            if res.exit_code != 0:
                raise RuntimeError(f"forkd sandbox setup of task {task_name!r}: {cmd!r} exited {res.exit_code} in "
                                   f"a child of {cfg.source}: {(res.stderr or res.stdout)[-800:]}")
        probe = await sb.commands.run(["/bin/sh", "-c", HOME_PROBE, "forkd-home", cfg.workdir or ""], user=cfg.user,
                                      timeout=60)
        if probe.exit_code != 0:
            raise RuntimeError(f"forkd sandbox: in a child of {cfg.source}, user {cfg.user or 'root'} has no working "
                               f"directory {cfg.workdir or '(its home)'}: {probe.stderr.strip()[-400:]}; create it "
                               "in `setup:` or set `workdir:`")
        workdir = probe.stdout.strip() or "/"
        if not cfg.setup:
            return _Task(cfg, cfg.template, workdir, None)
        tag = f"{TASK_PREFIX}{slug(task_name, 30)}-{uuid.uuid4().hex[:10]}"
        await sb.branch(tag, mode="live", wait=True)
        return _Task(cfg, tag, workdir, tag)
    finally:
        await _kill_quietly(ctrl, sb.id)
        await ctrl.aclose()
