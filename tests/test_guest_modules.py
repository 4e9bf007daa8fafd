"""The guest agent is several modules (forkd.guest.AGENT_MODULES) copied together into the guest's /forkd: the list
is complete, the modules import only the stdlib and each other (flatly: /forkd is sys.path[0] in the guest, and
the host package `forkd` is not there), the wheel ships them, and a booted guest runs them from /forkd."""

from __future__ import annotations

import ast
import fnmatch
import sys
import tomllib
from pathlib import Path

import pytest

from forkd.guest import AGENT_MODULES
from forkd.image import pycheck
from forkd.image.build import GUEST_DIR, GUEST_SOURCES

ROOT = Path(__file__).resolve().parent.parent
OWN = {m.removesuffix(".py") for m in AGENT_MODULES}


def _imports(name: str) -> set[str]:
    tree = ast.parse((GUEST_DIR / name).read_text(), filename=name)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: a relative import fails in the guest (/forkd is no package)"
            out.add(node.module.split(".")[0])
    return out


def test_the_list_is_every_agent_file():
    """A new agent_*.py next to agent.py is in AGENT_MODULES (else images would boot without it)."""
    on_disk = {p.name for p in GUEST_DIR.glob("agent*.py")}
    assert on_disk == set(AGENT_MODULES), on_disk ^ set(AGENT_MODULES)
    assert AGENT_MODULES[0] == "agent.py"  # what init.sh runs
    assert set(AGENT_MODULES) <= set(GUEST_SOURCES)  # image ids change when any of them changes


def test_agent_modules_import_only_the_stdlib_and_each_other():
    for name in AGENT_MODULES:
        for mod in _imports(name):
            assert mod != "forkd", f"{name} imports the host package forkd, which the guest does not have"
            assert mod != "agent", f"{name} imports agent.py, which runs as __main__ (a second copy of it)"
            assert mod in OWN or mod in sys.stdlib_module_names, f"{name} imports {mod}: the agent is stdlib-only"


def test_the_check_reads_every_agent_module():
    """pycheck's list holds the imports of each module (tarfile and ctypes only agent_fs.py imports), never the
    agent's own modules (they are forkd's files, not the image's stdlib)."""
    needed = set(pycheck.agent_modules())
    assert {"tarfile", "ctypes", "collections", "json", "builtins"} <= needed, needed
    assert not needed & OWN, needed & OWN
    assert needed == set().union(*(_imports(n) for n in AGENT_MODULES)) - OWN - {"forkd"}


def test_the_package_data_ships_every_guest_file():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["forkd.guest"]
    for name in [*GUEST_SOURCES]:
        assert any(fnmatch.fnmatch(name, pat) for pat in data), f"{name} is not in forkd.guest's package-data"


@pytest.mark.vm
def test_a_child_runs_the_agent_modules_from_forkd(rt, fork):
    (child,) = fork(1)
    r = rt.exec(child.id, ["ls", "/forkd"])
    assert set(AGENT_MODULES) <= set(r["stdout"].split()), r
    code = "sorted((n, m.__file__) for n, m in __import__('sys').modules.items() if n.startswith('agent_'))"
    loaded = dict(ast.literal_eval(rt.eval(child.id, code)["value"]))
    assert loaded == {m: f"/forkd/{m}.py" for m in OWN - {"agent"}}, loaded
