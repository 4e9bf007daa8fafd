"""Warm-up steps run in a guest before it is snapshotted (a parent or a layer): imports into the agent's
interpreter, Python code, shell commands. A failing step fails the snapshot with the step named."""

from __future__ import annotations

from collections.abc import Callable

from forkd.base.errors import ForkdError
from forkd.vmm.agent_client import AgentClient

# Run last in the guest's interpreter before it is snapshotted: what warm-up left is collected once, then moved out
# of the cyclic collector's reach, so a child's collections neither walk nor write the parent's objects (a write to a
# shared page is a private copy of it in the child).
FREEZE_HEAP = "import gc\ngc.collect()\ngc.freeze()\n"


def warm_up(agent: AgentClient, imports: tuple[str, ...] = (), code: tuple[str, ...] = (),
            run: tuple[str, ...] = (), progress: Callable[[str], None] = lambda s: None) -> None:
    """Run the warm-up steps in order, then freeze the interpreter's heap (FREEZE_HEAP)."""
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
    res = agent.exec_code(FREEZE_HEAP)
    if res["error"]:
        raise ForkdError(f"warm-up heap freeze failed: {res['error']['type']}: {res['error']['message']}")
