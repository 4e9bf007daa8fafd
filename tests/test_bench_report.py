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
    sequence number: `<date>-2` is newer than `<date>`), and lists every report."""
    reports = tmp_path / "benchmarks"
    reports.mkdir()
    for stem in ("2026-11-30", "2026-12-03", "2026-12-03-2", "2026-12-01"):
        (reports / f"{stem}.md").write_text(f"# {stem}\n")
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nintro\n\n{dated.INDEX_BEGIN}\nold\n{dated.INDEX_END}\n\nafter\n")
    dated.update_index(page, reports)
    text = page.read_text()
    assert "**Latest report: [2026-12-03-2](benchmarks/2026-12-03-2.md)**" in text
    assert REPORT_LINK.findall(text) == ["2026-12-03-2", "2026-12-03-2", "2026-12-03", "2026-12-01", "2026-11-30"]
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
