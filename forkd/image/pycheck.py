"""Does the image's Python have what forkd's agent imports? Checked on the unpacked rootfs, before anything boots.

An image whose Python lacks a module the agent imports boots to a kernel panic (the agent is PID 1: its
ModuleNotFoundError kills init), which is slow to reach and hard to read. Debian's `python3-minimal` alone (no
`json`) is the usual case. The image's Python is never run on the host (it is untrusted code), so the check reads
files: each module the agent imports that is written in Python (`json`, `subprocess`, ...) must be in the image's
standard library as source (`m.py`, `m/__init__.py`), sourceless bytecode (`.pyc`) or, should it be compiled
there, an extension (`lib-dynload/m.*.so`). Extension modules (`fcntl`, `select`, ...) may be built into the
image's interpreter and cannot be seen as files: they are not checked, nor are the agent's imports' own imports
(the stdlib's internals differ between versions; a module that is present but broken still panics at boot, and
the boot error then shows the console, forkd.vmm.qemu)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import sys
from pathlib import Path

from forkd.base.errors import InvalidInput
from forkd.guest import AGENT_MODULES
from forkd.image.build import GUEST_DIR


@functools.lru_cache(maxsize=1)
def agent_modules() -> tuple[str, ...]:
    """The top-level modules the agent imports anywhere in its files (forkd.guest.AGENT_MODULES, read from their
    source), less the agent's own modules (its siblings in the guest's /forkd)."""
    names: set[str] = set()
    for name in AGENT_MODULES:
        tree = ast.parse((GUEST_DIR / name).read_text(), filename=name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    own = {name.removesuffix(".py") for name in AGENT_MODULES}
    return tuple(sorted(n for n in names if n != "forkd" and n not in own and not n.startswith("__")))


def _files_only(name: str) -> bool:
    """True for a module written in Python in the host's stdlib (so in every Python's stdlib). Extension modules
    (`fcntl`, `select`...) are a build choice: a .so on one Python, built in on another (Debian's), so not checked."""
    if name in sys.builtin_module_names:
        return False
    spec = importlib.util.find_spec(name)
    return spec is not None and str(spec.origin).endswith(".py")


def _present(stdlib: Path, dynload: list[str], name: str) -> bool:
    candidates = (f"{name}.py", f"{name}.pyc", f"{name}/__init__.py", f"{name}/__init__.pyc")
    if any(os.path.isfile(stdlib / c) for c in candidates):
        return True
    return any(f == f"{name}.so" or f.startswith(f"{name}.") and f.endswith(".so") for f in dynload)


def missing_modules(stdlib: Path) -> list[str]:
    """The agent's imports that `stdlib` (the image's lib/pythonX.Y, already resolved inside the rootfs) lacks."""
    try:
        dynload = os.listdir(stdlib / "lib-dynload")
    except OSError:
        dynload = []
    return [m for m in agent_modules() if _files_only(m) and not _present(stdlib, dynload, m)]


def check_agent_modules(stdlib: Path, python: str, version: tuple[int, int]) -> None:
    """Raise InvalidInput naming every module the agent needs that the image's Python lacks, and what to install."""
    missing = missing_modules(stdlib)
    if not missing:
        return
    v = f"{version[0]}.{version[1]}"
    raise InvalidInput(f"the image's Python {v} ({python}) lacks modules forkd's agent imports: "
                       f"{', '.join(missing)} (checked before booting: the agent is the guest's PID 1, so a missing "
                       "module would panic the guest)",
                       hint=f"install its full standard library (Debian/Ubuntu: python3 or libpython{v}-stdlib, "
                            f"not python3-minimal alone; Alpine: python3), or start from python:{v}-slim")
