"""The network lab of the security tests: a test module's `lab(...)` run in a network namespace of its own
(`unshare --net`: this machine's interfaces and routes stay untouched, nothing leaves it), with a lease directory
of its own, its result handed back as JSON."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_lab(module: str, args: list[str], home: Path, timeout: float) -> dict:
    """`python -m module *args OUT.json` inside `unshare --net`, FORKD_HOME=home; what it wrote to OUT.json."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    run_dir = tempfile.mkdtemp(prefix="fkt-run-")  # leases of this lab: its own, not the host's
    env = dict(os.environ, FORKD_HOME=str(home), FORKD_RUN_DIR=run_dir)
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            res = subprocess.run(["unshare", "--net", "--", sys.executable, "-m", module, *args, f.name], env=env,
                                 capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
            return json.loads(Path(f.name).read_text())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def lab_main(lab: Callable[..., dict]) -> None:
    """The lab's side (a module's `if __name__ == "__main__"`): lab(*argv[1:-1]) written to argv[-1] as JSON."""
    with contextlib.suppress(BrokenPipeError):
        Path(sys.argv[-1]).write_text(json.dumps(lab(*sys.argv[1:-1])))
