"""bench/soak.py stays runnable: its short mode against a real daemon, in a module of its own (the longest benchmark
smoke test: the tier's workers take whole modules, so it runs beside the others, not after them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_bench_scripts import BENCH


@pytest.mark.vm
@pytest.mark.bench
def test_soak_short_mode_samples_every_series(rt, tmp_path):
    """bench/soak.py for 18 s, a sample every 4 s (--short's code path, a third of its length): claim/exec/branch/
    release churn against a real daemon with faults; every series is sampled, a slope printed for each, nothing left
    over at the end, and the dated report pair written."""
    rt.build_image()  # copied into the soak's private home
    res = subprocess.run([sys.executable, str(BENCH / "soak.py"), "--minutes", "0.3", "--interval", "4",
                          "--image-from", str(rt.layout.home), "--out", str(tmp_path), "--label", "ci", "-o", "json"],
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert set(out["slopes_per_min"]) == {"rss_mib", "swap_mib", "fds", "tmpfs_mib", "leftovers"}
    assert out["cycles"] > 1 and out["branches"] >= 1 and len(out["samples"]) >= 3, res.stderr[-3000:]
    assert out["failures"] == 0, res.stderr[-3000:]
    assert out["samples"][-1]["leftovers"] == 0, out["samples"][-1]
    assert out["leaked_qemu_at_end"] == []
    assert len(list(tmp_path.glob("soak-*-ci.md"))) == 1 and len(list(tmp_path.glob("soak-*-ci.json"))) == 1
