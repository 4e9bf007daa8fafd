"""Dated benchmark reports (no VM): bench/all.py writes a page stating the host and the load, and the docs quote only
the newest report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

from lib import dated  # noqa: E402
from lib.figures import FIGURES, extract  # noqa: E402

REPORT_LINK = re.compile(r"benchmarks/(\d{4}-\d{2}-\d{2}(?:-\d+)?)\.md")


@pytest.mark.bench
def test_all_writes_a_dated_page_with_host_and_load(tmp_path):
    """One command, one run: the plan benchmark (no VM) through bench/all.py into a directory of its own gives
    `<date>.md` + `<date>.json`; the page names the commit, cores, accelerator, kernel, QEMU and the load at start
    and end, and each figure with what it measures; the JSON keeps the load samples."""
    res = subprocess.run([sys.executable, str(BENCH / "all.py"), "--short", "--only", "plan", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    (page,) = tmp_path.glob("*.md")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", page.stem)
    report = json.loads(page.with_suffix(".json").read_text())
    text = page.read_text()
    for row in ("| commit |", "| cores |", "| accelerator |", "| kernel |", "| QEMU |",
                "| load average at start (1, 5, 15 min) |", "| load average at end |"):
        assert row in text, row
    assert report["host"]["commit"].split("+")[0] in text
    assert len(report["load"]["samples"]) >= 2 and len(report["load"]["at_start"]) == 3
    plan = [f for f in FIGURES if f.bench == "plan"]
    assert set(extract("plan", report["benchmarks"]["plan"]["result"])) == {f.label for f in plan}
    for f in plan:
        assert f"| {f.label} |" in text and f.measures in text, f.label


def test_index_names_the_newest_report_first(tmp_path):
    """The generated block of the benchmarks page links the newest report as the latest (date, then the day's
    sequence number as a number: `<date>-10` is newer than `<date>-2`, which is newer than `<date>`), and lists every
    report."""
    reports = tmp_path / "benchmarks"
    reports.mkdir()
    for stem in ("2026-11-30", "2026-12-03", "2026-12-03-2", "2026-12-03-10", "2026-12-01"):
        (reports / f"{stem}.md").write_text(f"# {stem}\n")
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nintro\n\n{dated.INDEX_BEGIN}\nold\n{dated.INDEX_END}\n\nafter\n")
    dated.update_index(page, reports)
    text = page.read_text()
    assert "**Latest report: [2026-12-03-10](benchmarks/2026-12-03-10.md)**" in text
    assert REPORT_LINK.findall(text) == ["2026-12-03-10", "2026-12-03-10", "2026-12-03-2", "2026-12-03", "2026-12-01",
                                         "2026-11-30"]
    assert text.startswith("# Benchmarks\n\nintro\n") and text.rstrip().endswith("after") and "old" not in text
    assert dated.stem_for(reports, "2026-12-03") == "2026-12-03"  # no JSON yet: the page alone is not a report
    (reports / "2026-12-03.json").write_text("{}")
    (reports / "2026-12-03-2.json").write_text("{}")
    assert dated.stem_for(reports, "2026-12-03") == "2026-12-03-3"


def test_docs_quote_only_the_newest_report():
    """docs/benchmarks.md's latest report is the newest page in docs/benchmarks/, and no other page of the docs (or
    the README) links an older dated report."""
    newest = dated.reports_in(ROOT / "docs" / "benchmarks")
    assert newest, "no dated report in docs/benchmarks/: run python3 bench/all.py --short"
    index = (ROOT / "docs" / "benchmarks.md").read_text()
    assert dated.index_block(ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "benchmarks") in index, \
        "docs/benchmarks.md's list of reports is not the generated one: run python3 bench/all.py --replot"
    latest = re.search(r"\*\*Latest report: \[([^\]]+)\]", index)
    assert latest and latest[1] == newest[0].stem
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs" / "layers").glob("*.md"))]
    for p in pages:
        if p.name == "benchmarks.md":
            continue
        stale = set(REPORT_LINK.findall(p.read_text())) - {newest[0].stem}
        assert not stale, f"{p.relative_to(ROOT)} links the dated report(s) {sorted(stale)}; the newest is " \
                          f"{newest[0].stem}"


def _plan_run(side: str, rnd: int, plan_p50: float, status_p50: float) -> dict:
    return {"round": rnd, "bench": "plan", "side": side, "exit_code": 0, "commit": side,
            "result": {"plan_ms": {"p50": plan_p50, "p90": plan_p50 * 1.5},
                       "status_ms": {"p50": status_p50, "p90": status_p50 * 1.5}}}


def test_compare_flags_a_move_over_ten_percent_and_judges_it_against_noise():
    """bench/compare.py's figures: B/A of p50 and p90; a move over 10 % is flagged, beyond noise when neither
    commit's own rounds spread as much; a failed run's figures are left out."""
    from lib.compare_stats import combine, rows

    runs = [_plan_run("A", 1, 100, 200), _plan_run("B", 1, 130, 210), _plan_run("B", 2, 128, 150),
            _plan_run("A", 2, 104, 300), {**_plan_run("B", 3, 1000, 1000), "exit_code": 1}]
    by = {r["figure"]: r for r in rows(combine(runs))}
    plan, status = by["plan()"], by["compute_status()"]
    assert plan["A"]["rounds"] == plan["B"]["rounds"] == 2  # the failed run is not counted
    assert plan["ratio_p50"] == pytest.approx(129 / 102) and plan["ratio_p90"] == pytest.approx(129 / 102)
    assert plan["noise"] == pytest.approx(4 / 102)
    assert plan["verdict"] == "MOVED > 10 %, beyond noise"
    assert status["ratio_p50"] == pytest.approx(180 / 250) and status["verdict"] == "moved > 10 %, within noise"
    same = rows(combine([_plan_run("A", 1, 100, 100), _plan_run("B", 1, 109, 91)]))
    assert [r["verdict"] for r in same] == ["same (within 10 %)", "same (within 10 %)"]


def test_compare_interleaves_and_swaps_who_goes_first(monkeypatch):
    """Each benchmark runs on A and B one right after the other, A first in odd rounds and B first in even ones."""
    import compare

    order = []
    monkeypatch.setattr(compare, "run_bench", lambda side, name, timeout: order.append((name, side.label)) or
                        {"exit_code": 0})
    a = compare.Side("A", "a" * 40, Path("/a"), Path("/a/python"), Path("/a/home"))
    b = compare.Side("B", "b" * 40, Path("/b"), Path("/b/python"), Path("/b/home"))
    compare.interleave((a, b), ["plan", "pool"], 2, 60)
    assert order == [("plan", "A"), ("plan", "B"), ("pool", "A"), ("pool", "B"),
                     ("plan", "B"), ("plan", "A"), ("pool", "B"), ("pool", "A")]


def test_compare_runs_api_on_both_sides_with_the_cap_api_sets_for_its_daemon(monkeypatch):
    """The api benchmark's 100 evals on 20 threads must not meet a per-child cap of guest calls on either commit:
    compare.py sets FORKD_GUEST_IO_PER_CHILD for the api runs of both sides (an older commit's api.py does not set
    it), to the value bench/api.py gives the daemon it starts, which its threads cannot exceed; other benchmarks
    run without it."""
    import api
    import compare

    seen = {}

    def fake_sh(argv, env=None, cwd=None, timeout=None):
        seen[(Path(argv[1]).stem, cwd)] = env
        return subprocess.CompletedProcess(argv, 0, "{}", "")

    monkeypatch.setattr(compare, "sh", fake_sh)
    monkeypatch.delenv("FORKD_GUEST_IO_PER_CHILD", raising=False)
    sides = [compare.Side(x, x.lower() * 40, Path(f"/{x}"), Path(f"/{x}/python"), Path(f"/{x}/home")) for x in "AB"]
    for side in sides:
        for name in ("api", "fork"):
            compare.run_bench(side, name, 60)
    daemon = api.daemon_env("/h")
    assert int(daemon["FORKD_GUEST_IO_PER_CHILD"]) >= api.CONCURRENT_THREADS
    for side in sides:
        assert seen[("api", side.src)]["FORKD_GUEST_IO_PER_CHILD"] == daemon["FORKD_GUEST_IO_PER_CHILD"]
        assert "FORKD_GUEST_IO_PER_CHILD" not in seen[("fork", side.src)]
