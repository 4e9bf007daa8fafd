"""The shape rules of the code base that the layer contract (import-linter, run by scripts/test.sh) does not cover:
no function over MAX_LINES, with no exemptions; and that the import contracts the redesign relies on exist and
name every package (lint-imports checks only what a contract names)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def long_functions(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "forkd").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    out.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_over_the_limit():
    assert long_functions(ROOT) == [], f"split these into named steps (limit {MAX_LINES} lines)"


def test_long_function_check_can_fail(tmp_path):
    """The guard itself: a 61-line function in a scratch tree is reported."""
    pkg = tmp_path / "forkd"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "m.py").write_text(f"def too_long():\n{body}\n")
    assert [s.split()[1] for s in long_functions(tmp_path)] == ["too_long"]


def _contracts() -> dict[str, dict]:
    import tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["name"].split(":")[0]: c for c in cfg["contracts"]}


def _packages() -> set[str]:
    return {f"forkd.{p.name}" for p in (ROOT / "forkd").iterdir() if (p / "__init__.py").is_file()}


def test_the_layer_contract_holds_every_package_in_the_briefs_order():
    """A package added later cannot sit outside the layers (lint-imports only checks the packages it names)."""
    layers = [[m.strip() for m in layer.split("|")] for layer in _contracts()["layers"]["layers"]]
    assert layers == [["forkd.cli", "forkd.api", "forkd.operator", "forkd.mcp"], ["forkd.sdk"], ["forkd.client"],
                      ["forkd.service"], ["forkd.reconciler"], ["forkd.spec"], ["forkd.core"],
                      ["forkd.sandbox", "forkd.store", "forkd.image"], ["forkd.vmm"], ["forkd.guest", "forkd.base"]]
    assert {m for layer in layers for m in layer} == _packages()


def test_the_other_contracts_exist_and_cover_every_package():
    c = _contracts()
    assert {"plan is pure", "one front door", "one service", "the VMM seam"} <= set(c)
    assert c["one service"]["source_modules"] == ["forkd.api"]
    assert "forkd.core" in c["one service"]["forbidden_modules"]
    assert set(c["plan is pure"]["source_modules"]) == {"forkd.reconciler.plan", "forkd.reconciler.world",
                                                        "forkd.reconciler.status"}
    assert c["one front door"]["source_modules"] == ["forkd.cli"]
    assert {"forkd.core", "forkd.vmm"} <= set(c["one front door"]["forbidden_modules"])
    vmm = c["the VMM seam"]
    assert set(vmm["source_modules"]) == _packages() - {"forkd.vmm"}  # the seam holds for whoever is added


# what the layers above forkd.vmm may import of it: the driver interface (and its value types), the driver's
# choice by configuration, the guest protocol every driver's `vm.agent` speaks, and the host's paging of a VMM
SEAM_ALLOWED = {"forkd.vmm.driver", "forkd.vmm.drivers", "forkd.vmm.agent_client", "forkd.vmm.agent_replies",
                "forkd.vmm.agent_files", "forkd.vmm.agent_tcp", "forkd.vmm.pageout"}


def test_every_vmm_module_is_either_the_interface_or_behind_the_seam():
    """A module added to forkd/vmm/ is forbidden above it unless it is named here as part of the interface."""
    forbidden = set(_contracts()["the VMM seam"]["forbidden_modules"])
    modules = {f"forkd.vmm.{p.stem}" for p in (ROOT / "forkd" / "vmm").glob("*.py") if p.stem != "__init__"}
    assert not forbidden & SEAM_ALLOWED
    assert modules == forbidden | SEAM_ALLOWED, f"classify: {sorted(modules ^ (forbidden | SEAM_ALLOWED))}"
