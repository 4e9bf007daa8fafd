"""bench/soak.py's report, from results made here (no VM): every fault counted with the promises it broke, a
status line saying whether the run completed, the dated files rewritten in place."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from tests.faults.inject import Outcome

spec = importlib.util.spec_from_file_location("bench_soak", Path(__file__).resolve().parents[2] / "bench/soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


class _Churn:
    cycles, branches, failures, latency_ms = 12, 4, 0, [900.0, 1100.0]


def _faults(outcomes: list[Outcome]):
    f = soak.Faults.__new__(soak.Faults)
    f.outcomes = outcomes
    return f


def test_the_soak_report_counts_each_fault_and_names_each_broken_promise(tmp_path):
    samples = [{"t_min": float(i), "rss_mib": 80.0 + i, "swap_mib": 0.0, "fds": 10, "tmpfs_mib": 256.0, "leftovers": 0,
                "children": 2} for i in range(4)]
    outcomes = [Outcome("hung_vmm"), Outcome("tmpfs_full", ["the refused spawn does not name FORKD_SHM: x"]),
                Outcome("hung_vmm")]
    res = soak.result(_Churn(), _faults(outcomes), samples, 60.0)
    assert res["faults"] == {"hung_vmm": {"injected": 2, "held": 2, "broken": []},
                             "tmpfs_full": {"injected": 1, "held": 0,
                                            "broken": ["the refused spawn does not name FORKD_SHM: x"]}}
    report = soak.Report(tmp_path, "hour")
    report.write(res, "stopped early")
    text = (tmp_path / f"soak-{report.day}-hour.md").read_text()
    assert "Status: stopped early;" in text
    assert "fault hung_vmm    injected 2, promise held 2" in text
    assert "broken: the refused spawn does not name FORKD_SHM: x" in text
    data = json.loads((tmp_path / f"soak-{report.day}-hour.json").read_text())
    assert data["status"] == "stopped early" and data["cycles"] == 12


def test_the_faults_injected_are_those_the_host_and_flags_allow():
    f = soak.Faults(rig=None, rt=None, api=None, pool="p", every=3, shm=Path("/x"), kill_daemon=False)
    assert f.kinds == ["hung_vmm", "tmpfs_full"]
    assert soak.Faults(None, None, None, "p", 3, None, True).kinds == ["hung_vmm", "daemon_kill"]
    full = soak.Faults(None, None, None, "p", 3, Path("/x"), True, pack_file=Path("/y/p.tar.zst"))
    assert full.kinds == ["hung_vmm", "tmpfs_full", "home_full", "daemon_kill"]


def test_the_report_gives_the_host_load_beside_the_series():
    samples = [{"t_min": float(i), "load1": load, "rss_mib": 80.0, "swap_mib": 0.0, "fds": 10, "tmpfs_mib": 256.0,
                "leftovers": 0, "children": 2} for i, load in enumerate([30.5, 12.0, 18.25])]
    text = soak.text(soak.result(_Churn(), _faults([]), samples, 60.0))
    assert "host load average (1 min) at the samples: min 12.0, median 18.2, max 30.5" in text


def test_a_sample_reads_the_daemons_resident_and_swapped_memory(tmp_path):
    """The process stands in as the daemon (its /proc is read, nothing else of it); the home is real and empty."""
    class _Rig:
        def daemon_pid(self) -> int:
            return os.getpid()

    got = soak.sample(_Rig(), Runtime(Layout(tmp_path / "home")))
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    assert got["swap_mib"] == pytest.approx(int(status["VmSwap"].split()[0]) / 1024, abs=2.0)
    assert got["rss_mib"] == pytest.approx(int(status["VmRSS"].split()[0]) / 1024, rel=0.5)
    assert (got["leftovers"], got["tmpfs_mib"]) == (0, 0.0)


def test_the_tracemalloc_diff_names_the_line_that_grew(tmp_path, capsys):
    """`--tracemalloc-diff A B`: what was allocated between two snapshots, by the line that allocated it."""
    import tracemalloc

    tracemalloc.start(4)
    try:
        tracemalloc.take_snapshot().dump(str(tmp_path / "a.snap"))
        held = bytearray(8 << 20)  # the growth: this line
        tracemalloc.take_snapshot().dump(str(tmp_path / "b.snap"))
    finally:
        tracemalloc.stop()
    assert soak.tracemalloc_diff(tmp_path / "a.snap", tmp_path / "b.snap", top=3) == 0
    out = capsys.readouterr().out
    first = out.split(" MiB ", 2)[1]  # the biggest growth, listed first
    assert out.splitlines()[1].lstrip().startswith("+8.00 MiB") and "held = bytearray(8 << 20)" in first, out
    assert len(held) == 8 << 20
