"""Warm-up steps run in a guest before it is snapshotted (a parent or a layer): imports into the agent's
interpreter, Python code, shell commands. A failing step fails the snapshot with the step named."""

from __future__ import annotations

from collections.abc import Callable

from forkd.base.errors import ForkdError
from forkd.vmm.agent_client import AgentClient


def warm_up(agent: AgentClient, imports: tuple[str, ...] = (), code: tuple[str, ...] = (),
            run: tuple[str, ...] = (), progress: Callable[[str], None] = lambda s: None) -> None:
    if imports:
        progress(f"warming up: import {', '.join(imports)}")
        res = agent.exec_code("".join(f"import {m}\n" for m in imports))
        if res["error"]:
            raise ForkdError(f"warm-up import failed: {res['error']['type']}: {res['error']['message']}")
    for c in code:
        progress(f"warming up: exec {c[:40]!r}")
        res = agent.exec_code(c)
        if res["error"]:
            raise ForkdError(f"warm-up code failed: {res['error']['type']}: {res['error']['message']}")
    for cmd in run:
        progress(f"warming up: {cmd}")
        agent.run_shell(cmd, timeout=600, what="warm-up command")
