"""The benchmark scripts stay runnable: each parses its arguments (imports included); plan.py runs whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_help(script):
    res = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "usage" in res.stdout.lower()


def test_plan_bench_meets_its_own_output_contract():
    res = subprocess.run([sys.executable, str(BENCH / "plan.py"), "--runs", "3"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "plan():" in res.stdout and "1000" in res.stdout


def test_pool_bench_registry_only_short_mode():
    res = subprocess.run([sys.executable, str(BENCH / "pool.py"), "--registry-only", "--rounds", "3"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "hand out 32" in res.stdout and "before" in res.stdout and "p90" in res.stdout


@pytest.mark.vm
def test_soak_short_mode_samples_every_series(rt):
    """bench/soak.py --short: a minute of claim/exec/branch/release churn against a real daemon; every series is
    sampled, a slope printed for each, nothing left over at the end."""
    import json

    rt.build_image()  # copied into the soak's private home
    res = subprocess.run([sys.executable, str(BENCH / "soak.py"), "--short", "--image-from", str(rt.layout.home),
                          "-o", "json"], capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert set(out["slopes_per_min"]) == {"rss_mib", "fds", "tmpfs_mib", "leftovers"}
    assert out["cycles"] > 1 and out["branches"] >= 1 and len(out["samples"]) >= 3, res.stderr[-3000:]
    assert out["failures"] == 0, res.stderr[-3000:]
    assert out["samples"][-1]["leftovers"] == 0, out["samples"][-1]
    assert out["leaked_qemu_at_end"] == []
