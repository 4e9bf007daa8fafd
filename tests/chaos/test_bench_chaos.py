"""bench/chaos.py's report over many seeds, from harness reports made here (no VM): every kill counted, every
violation named with its seed, round and replay command, recovery percentiles over every round."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from tests.chaos.harness import Report, Round

spec = importlib.util.spec_from_file_location("bench_chaos", Path(__file__).resolve().parents[2] / "bench/chaos.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _report(seed: int, recover: list[float | None], bad: dict[int, str]) -> Report:
    rep = Report(seed=seed, rounds=[Round(0)])
    for n, r in enumerate(recover, 1):
        rep.rounds.append(Round(n, recover_s=r, killed_cli=["kill"] * n, daemon_up_s=float(n),
                                violations={"orphans": [bad[n]]} if n in bad else {}))
    return rep


def test_the_report_counts_every_kill_and_names_every_violation_with_its_replay():
    reports = [_report(100, [1.0, 2.0, 3.0], {}), _report(101, [4.0, None], {2: "child directory x has no record"})]
    t = bench.totals(reports)
    assert (t["kills"], t["survived"], t["cli_killed"], t["never_recovered"]) == (5, 4, 9, 1)
    assert (t["recover_p50_s"], t["recover_p90_s"]) == (2.5, 4.0)
    assert (t["daemon_up_p50_s"], t["daemon_up_max_s"]) == (2.0, 3.0)
    fails = bench.failing(reports)
    assert fails == [(101, 2, ["orphans: child directory x has no record"])]
    text = bench.markdown("2000-01-01", t, fails, {"101:2": True}, "python3 bench/chaos.py")
    assert "seed 101 round 2 (violated again; replay: `python -m tests.chaos --seed 101 --round 2`)" in text
    assert "child directory x has no record" in text and "daemon kills: 5, survived" in text


def test_the_report_written_mid_run_says_how_many_planned_kills_completed(tmp_path):
    args = argparse.Namespace(seeds=10, kills=50, out=tmp_path, label="long")
    job = bench.Run(args)
    job.reports = [_report(100, [1.0] * 50, {}), _report(101, [2.0] * 7, {3: "child directory y has no record"})]
    job.errors.append("stopped by SIGTERM during seed 101")
    job.write("stopped early")
    text = (tmp_path / f"chaos-{job.day}-long.md").read_text()
    assert "Status: stopped early;" in text
    assert "57 of 500 planned kills (10 seeds x 50) completed over 2 seeds" in text
    assert "stopped by SIGTERM during seed 101" in text and "seed 101 round 3" in text
    data = json.loads((tmp_path / f"chaos-{job.day}-long.json").read_text())
    assert (data["kills"], data["survived"]) == (57, 56) and data["status"].startswith("stopped early")
