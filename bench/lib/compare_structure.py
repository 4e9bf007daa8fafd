"""What two trees are made of, beside their timings: lines of Python per package, and the files a request crosses
(bench/crossings.py run by each tree's own interpreter, in-process, on its own home)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

PARENT = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: crossings-parent}
spec: {memoryMiB: 256}
"""
RT = ("import os, sys; from pathlib import Path; from forkd.base.paths import Layout; "
      "from forkd.core.runtime import Runtime; rt = Runtime(Layout(Path(os.environ['FORKD_HOME']))); ")
TAGS = RT + "print('\\n'.join(s.tag for s in rt.snapshots()))"
FORK = RT + "from forkd.core.requests import Spawn; print(rt.fork(Spawn.of(tag=sys.argv[1], n=1))[0].id)"


def lines_per_package(src: Path) -> dict[str, dict[str, int]]:
    """forkd/<package> -> {files, lines} of its .py files (modules directly under forkd/ as "(top)")."""
    out: dict[str, dict[str, int]] = {}
    pkg_root = src / "forkd"
    for f in sorted(pkg_root.rglob("*.py")):
        rel = f.relative_to(pkg_root)
        key = rel.parts[0] if len(rel.parts) > 1 else "(top)"
        acc = out.setdefault(key, {"files": 0, "lines": 0})
        acc["files"] += 1
        acc["lines"] += len(f.read_bytes().splitlines())
    return out


def test_modules(src: Path) -> dict[str, int]:
    """Test modules (tests/**/test_*.py) and how many carry the `vm` marker (boot QEMU)."""
    mods = sorted((src / "tests").rglob("test_*.py"))
    return {"modules": len(mods), "with_vm_marker": sum(1 for m in mods if "mark.vm" in m.read_text())}


def _traced(side, script: Path, argv: list[str], timeout: float) -> dict:
    res = subprocess.run([str(side.python), str(script), "-o", "json", "--", *argv], capture_output=True, text=True,
                         env=side.env(FORKD_NO_DAEMON="1"), cwd=side.src, timeout=timeout)
    out = last_json(res.stdout)  # the command's own output comes first
    return out if out is not None else {"exit": res.returncode, "error": (res.stderr or res.stdout)[-2000:]}


def last_json(text: str) -> dict | None:
    """The JSON document at the end of `text` (it starts a line), or None."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    while start > 0 or text.startswith("{"):
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            nxt = text.find("\n{", start)
            if nxt < 0:
                return None
            start = nxt + 1
    return None


def _one_side(side, script: Path, timeout: float) -> dict:
    """Apply a ForkParent (built: QEMU booted, warmed, snapshotted), then branch a child of its snapshot."""
    def tags() -> set[str]:
        res = subprocess.run([str(side.python), "-c", TAGS], capture_output=True, text=True, env=side.env(),
                             cwd=side.src, timeout=120)
        return set(res.stdout.split())

    spec = side.home / "crossings-parent.yaml"
    spec.write_text(PARENT)
    before = tags()
    out = {"apply": _traced(side, script, ["apply", "-f", str(spec), "--wait", "--timeout", "15m"], timeout)}
    made = sorted(tags() - before)
    if not made:
        out["branch"] = {"error": "the apply made no snapshot to fork"}
        return out
    res = subprocess.run([str(side.python), "-c", FORK, made[0]], capture_output=True, text=True, env=side.env(),
                         cwd=side.src, timeout=600)
    child = res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() else None
    if child is None:
        out["branch"] = {"error": f"fork of {made[0]} failed: {res.stderr[-1000:]}"}
        return out
    out["branch"] = _traced(side, script, ["branch", child, "--tag", "crossings-branch"], timeout)
    return out


def crossings(sides: list, script: Path, timeout: float = 1800.0) -> dict[str, dict]:
    """Per side (both at once: these are counts of files, not times): the apply's and the branch's crossings."""
    found: dict[str, dict] = {}

    def run(side) -> None:
        try:
            found[side.label] = _one_side(side, script, timeout)
        except (OSError, subprocess.SubprocessError) as exc:
            found[side.label] = {"error": f"{type(exc).__name__}: {exc}"}

    threads = [threading.Thread(target=run, args=(s,)) for s in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return found
