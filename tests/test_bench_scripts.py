"""The benchmark scripts stay runnable: each parses its arguments (imports included); plan.py runs whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.core.runtime import Runtime

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_help(script):
    res = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "usage" in res.stdout.lower()


@pytest.mark.bench
def test_plan_bench_meets_its_own_output_contract():
    res = subprocess.run([sys.executable, str(BENCH / "plan.py"), "--runs", "3"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "plan():" in res.stdout and "1000" in res.stdout


@pytest.mark.bench
def test_pool_bench_registry_only_short_mode():
    res = subprocess.run([sys.executable, str(BENCH / "pool.py"), "--registry-only", "--rounds", "3"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "hand out 32" in res.stdout and "before" in res.stdout and "p90" in res.stdout


@pytest.mark.vm  # through the script, in a subprocess
@pytest.mark.bench
def test_bench_all_short_writes_one_report_and_the_plots(home, tmp_path):
    """bench/all.py --short with the benchmarks behind the plots (fork, density) on real VMs: one dated page and JSON
    report with each benchmark's parsed result, and the three PNGs the page shows. Checks that they run, not how
    fast."""
    res = subprocess.run([sys.executable, str(BENCH / "all.py"), "--short", "--only", "plan,fork,density",
                          "--home", str(home), "--out", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    (page,) = tmp_path.glob("*.md")
    report = json.loads(page.with_suffix(".json").read_text())
    assert {n: r["exit_code"] for n, r in report["benchmarks"].items()} == {"plan": 0, "fork": 0, "density": 0}
    density = report["benchmarks"]["density"]["result"]
    assert density["final"]["n"] == 4 and len(density["levels"]) == 2
    assert density["final"]["exec_ms"]["n"] == 5 and density["limits"]["measured_up_to_n"] == 4
    assert report["benchmarks"]["fork"]["result"]["fanout"]["n"] == 4
    for png in ("fork-latency-cdf.png", "fanout-timeline.png", "memory-per-child.png"):
        assert (tmp_path / f"{page.stem}-{png}").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({page.stem}-{png})" in page.read_text(), png
    assert not [c for c in Runtime(Layout(home)).children() if c.snapshot.startswith(("bench-density", "bench-fork"))]


@pytest.mark.vm  # through the script, in a subprocess
@pytest.mark.bench
def test_density_short_mode(home):
    """bench/density.py --short: 4 children in batches of 2, the JSON report's shape; its children are stopped."""
    res = subprocess.run([sys.executable, str(BENCH / "density.py"), "--short", "--home", str(home), "-o", "json"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert [p["n"] for p in r["levels"]] == [2, 4] and r["final"]["n"] == 4
    for p in [*r["levels"], r["final"]]:
        assert p["pss_sum_mib"] > 0 and p["exec_ms"]["n"] >= 3
    assert r["limits"]["n_memory_runs_out"] > 4


@pytest.mark.vm  # through the script, in a subprocess
@pytest.mark.bench
@pytest.mark.skipif(os.geteuid() != 0, reason="bench/wake.py needs root (hugetlb pages, process_madvise)")
def test_wake_short_mode(home, swap):
    """bench/wake.py --short on real VMs and a real swap: the host's fault cost, a page-in's cost and the exec rounds
    with and without memory held back, in the JSON report's shape; the hugetlb pages it held are given back and its
    children stopped."""
    before = Path("/proc/sys/vm/nr_hugepages").read_text()
    res = subprocess.run([sys.executable, str(BENCH / "wake.py"), "--short", "--home", str(home), "-o", "json"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout)
    assert len(r["first_touch_us_per_page"]) == 3 and min(r["first_touch_us_per_page"]) > 0
    assert r["page_in"] and all(p["kib"] > 0 for p in r["page_in"]), r["page_in"]
    (as_is,), (squeezed,) = r["rounds"]["as_is"], r["rounds"]["squeezed"]
    assert as_is["held_gib"] == 0 and squeezed["held_gib"] > 0
    assert squeezed["mem_available_gib"] < as_is["mem_available_gib"]
    assert as_is["p50_ms"] > 0 and squeezed["p99_ms"] >= squeezed["p50_ms"]
    assert Path("/proc/sys/vm/nr_hugepages").read_text() == before
    assert not [c for c in Runtime(Layout(home)).children() if c.snapshot.startswith("bench-density")]


@pytest.mark.vm  # through the script, in a subprocess
@pytest.mark.bench
@pytest.mark.long  # minutes: podman and an Inspect eval on three providers
def test_inspect_eval_tiny_run_on_every_provider(rt, tmp_path):
    """bench/inspect_eval.py --samples 2: the same eval on local, podman (when installed) and forkd, every sample
    scored correct on each, ratios and a dated report pair written; its forkd home leaves no QEMU behind."""
    rt.build_image()  # copied into the bench's private home
    res = subprocess.run([sys.executable, str(BENCH / "inspect_eval.py"), "--samples", "2", "--max-samples", "2",
                          "--image-from", str(rt.layout.home), "--report-dir", str(tmp_path), "-o", "json"],
                         capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    ran = {r["provider"]: r for r in out["runs"]}
    assert set(ran) | set(out["skipped"]) == {"local", "podman", "forkd"} and {"local", "forkd"} <= set(ran)
    for r in ran.values():
        assert (r["n"], r["samples"], r["correct"]) == (2, 2, 2), r
        assert r["sample_total_s"]["p90"] >= r["sample_total_s"]["p50"] > 0
    assert {q["of"] for q in out["ratios"]} >= {"forkd/local"}
    assert out["leaked_qemu"] == []
    assert len(list(tmp_path.glob("*-inspect-eval-n2.json"))) == 1
    assert len(list(tmp_path.glob("*-inspect-eval-n2.md"))) == 1


@pytest.mark.vm  # through the script, in a subprocess
@pytest.mark.bench
@pytest.mark.long  # minutes: podman and an Inspect eval on three providers
def test_rollouts_tiny_run_on_every_side(rt, tmp_path):
    """bench/rollouts.py --n 3: forks of the warm parent, cold boots and podman (when installed) each run 3
    differently patched copies of the project's tests; the patch that keeps SCALE = 1 passes, the others fail."""
    rt.build_image()
    res = subprocess.run([sys.executable, str(BENCH / "rollouts.py"), "--n", "3", "--image-from",
                          str(rt.layout.home), "--report-dir", str(tmp_path), "-o", "json"],
                         capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    ran = {r["side"]: r for r in out["runs"]}
    assert set(ran) | set(out["skipped"]) == {"fork", "cold", "podman"} and {"fork", "cold"} <= set(ran)
    assert all(r["as_expected"] == 3 and r["wall_s"] > 0 for r in ran.values()), ran
    assert {q["of"] for q in out["ratios"]} >= {"cold/fork"}
    assert len(list(tmp_path.glob("*-rollouts-n3.json"))) == 1
