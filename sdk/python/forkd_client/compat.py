"""Code written for upstream forkd's Python client runs unchanged against this daemon:

    from forkd_client.compat import Controller, ControllerError, Sandbox   # was: from forkd import ...
    c = Controller(base_url="http://127.0.0.1:8889", token=..., timeout=60.0)
    [child] = c.spawn_sandboxes("base", n=1); c.eval_code(child["id"], "1+1")["result"]      # plain dicts
    with Sandbox(tag="base") as sb:                   # forks a child through the daemon (not the `forkd` CLI)
        sb.commands.run("echo hi").stdout; sb.eval("1 + 1")   # eval returns the value: '2' (its repr, as upstream)

Results are plain dicts and lists, as upstream's; failures are ControllerError (`status`, `body`, `url`), whose
subclasses say the kind (NotFound, Conflict, ...). `Sandbox.eval` raises RuntimeError when the code raised, as
upstream's does. Upstream's `target=` (the guest agent's host:port) is accepted and ignored: the daemon routes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from forkd_client import api
from forkd_client.errors import ForkdError

ControllerError = ForkdError


def _plain(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_plain(o) for o in obj]
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


class Controller:
    """Upstream's `Controller(base_url=None, token=None, timeout=60.0)`: base_url defaults to $FORKD_URL, then the
    local daemon's unix socket, then http://127.0.0.1:8889; results are dicts."""

    def __init__(self, base_url: str | None = None, token: str | None = None, timeout: float = 60.0):
        self._c = api.Client(url=base_url, token=token, timeout=timeout)
        self.base_url, self.token, self.timeout = self._c.base_url, self._c.token, timeout

    def list_snapshots(self) -> list[dict]:
        return _plain(self._c.list_snapshots())

    def delete_snapshot(self, tag: str) -> None:
        self._c.delete_snapshot(tag)

    def spawn_sandboxes(self, snapshot_tag: str, n: int = 1, per_child_netns: bool = False,
                        memory_limit_mib: int | None = None) -> list[dict]:
        return _plain(self._c.spawn_sandboxes(snapshot_tag, n, per_child_netns, memory_limit_mib))

    def list_sandboxes(self) -> list[dict]:
        return _plain(self._c.list_sandboxes())

    def get_sandbox(self, sandbox_id: str) -> dict:
        return _plain(self._c.get_sandbox(sandbox_id))

    def kill_sandbox(self, sandbox_id: str) -> None:
        self._c.kill_sandbox(sandbox_id)

    def branch_sandbox(self, sandbox_id: str, tag: str | None = None, mode: str = "live", wait: bool = True) -> dict:
        return _plain(self._c.branch_sandbox(sandbox_id, tag, mode, wait))

    def exec_command(self, sandbox_id: str, args: list[str], timeout_secs: int = 30) -> dict:
        return _plain(self._c.exec_command(sandbox_id, args, timeout_secs))

    def eval_code(self, sandbox_id: str, code: str) -> dict:
        return _plain(self._c.eval_code(sandbox_id, code))

    def ping_sandbox(self, sandbox_id: str) -> dict:
        return _plain(self._c.ping_sandbox(sandbox_id))


@dataclass
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int


class _Commands:
    def __init__(self, sb: Sandbox):
        self._sb = sb

    def run(self, cmd: str | list[str], timeout: int = 30) -> CommandResult:
        args = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        res = self._sb._ctrl.exec_command(self._sb.sandbox_id, args, timeout)
        return CommandResult(stdout=res["stdout"], stderr=res["stderr"], exit_code=int(res["exit_code"]))


class Sandbox:
    """Upstream's `Sandbox(tag=None, target=None, timeout=30, *, spawn=True)`: forks one child of `tag`
    ($FORKD_TAG, default "pyagent") through the daemon; `kill()` / leaving `with` kills it."""

    DEFAULT_TAG = os.environ.get("FORKD_TAG", "pyagent")

    def __init__(self, tag: str | None = None, target: str | None = None, timeout: int = 30, *, spawn: bool = True,
                 base_url: str | None = None, token: str | None = None):
        self.tag, self.target, self.timeout = tag or self.DEFAULT_TAG, target, timeout
        self._ctrl = Controller(base_url, token)
        self.commands = _Commands(self)
        self.sandbox_id: str | None = None
        if spawn:
            self.sandbox_id = self._ctrl.spawn_sandboxes(self.tag, 1)[0]["id"]

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> Sandbox:
        return cls(*args, **kwargs)

    def eval(self, code: str) -> object:
        """The value of `code` in the warm interpreter (its repr, as upstream's Python recipes return)."""
        res = self._ctrl._c.eval_code(self.sandbox_id, code, self.timeout)
        if res.error:
            raise RuntimeError(f"forkd eval: {res.error}")
        return res.result

    def ping(self) -> dict:
        return self._ctrl.ping_sandbox(self.sandbox_id)

    def kill(self) -> None:
        if self.sandbox_id is None:
            return
        try:
            self._ctrl.kill_sandbox(self.sandbox_id)
        except ForkdError as e:
            if e.status != 404:
                raise
        self.sandbox_id = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
