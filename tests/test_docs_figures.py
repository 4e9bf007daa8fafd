"""Every measured figure the docs quote names the dated report it comes from (no VM): a paragraph, list item or
table holding a figure links a report under bench/reports/ or docs/benchmarks/ that exists, and no heading holds a
figure. A figure is a number with a unit (ms, s, MiB, %, x, ...) outside code; a setting or limit (a default, a cap,
an interval, a target) is not a measurement, told by the words before it or by `SETTINGS`."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# pages generated from the code's settings, models and metrics (tests/test_reference_pages.py): their numbers are
# defaults and limits, never measurements
GENERATED = {"settings.md", "spec.md", "metrics.md"}
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "ARCHITECTURE.md",
         *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED),
         *sorted((ROOT / "docs" / "layers").glob("*.md"))]
REPORT_DIRS = ("bench/reports/", "docs/benchmarks/")

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
# a number (1,500 / 0.3 / a range 55-270) and a unit; not part of a word, a version (3.11) or a path
FIGURE = re.compile(r"(?<![\w.\-/])\d+(?:[.,]\d+)*(?:\s?(?:-|–|to)\s?\d+(?:\.\d+)?)?\s?"
                    r"(?:ms|us|µs|s|min|[MGK]iB/s|MiB|GiB|KiB|MB|GB|KB|%|x|×|req/s|children/s)(?![\w/])")
# the words that make the figure after them a setting or a limit, within its clause
SETTING = re.compile(r"(?:\b(?:defaults?|at most|up to(?: the)?|limit(?:ed)?(?: to)?|caps?|ceiling|past|beyond|"
                     r"more than|over|above|outgrows|every|minimum|target|bounded|timeout|deadline|interval|waits?|"
                     r"within the|"
                     r"polls?|keepalive|longer than|idle for|on a|of a|a)|<=|>=|``,|`` \(|\s\+)\s*\(?$", re.I)
# ... or the words after it: a default, a cap, the size of what a run is set up with
SETTING_AFTER = re.compile(r"^-?\)?\s*(?:by default|default|cap|ring|buffer|minimum|chunks?|requests|pages|rootfs|"
                           r"guests?|parents?|snapshot|limited|loop-mounted|tmpfs\b)", re.I)
SETTINGS = {
    ("SECURITY.md", "16 KiB"): "the cap on a reply's JSON structure",
    ("SECURITY.md", "2 x"): "two frames' worth, a cap",
    ("SECURITY.md", "64 MiB"): "MAX_FRAME and the caps sized from it",
    ("SECURITY.md", "5 s"): "a template's rendering deadline",
    ("SECURITY.md", "1 MiB"): "the caps on unread output and on one read",
    ("SECURITY.md", "40 MiB"): "the size a test streams",
    ("docs/crash-harness.md", "240 s"): "the harness's wait for progress",
    ("docs/crash-harness.md", "900 s"): "the harness's wait in all",
    ("docs/crash-harness.md", "5 s"): "the QMP greeting timeout",
    ("docs/faults.md", "64 MiB"): "the free space a test leaves",
    ("docs/faults.md", "16 MiB"): "a buffer's cap and what a test writes",
    ("docs/faults.md", "10 s"): "the QMP socket timeout",
    ("docs/faults.md", "90 s"): "the guest answer timeout",
    ("docs/faults.md", "240 s"): "the harness's wait for progress",
    ("docs/faults.md", "900 s"): "the harness's wait in all",
    ("docs/how-it-works.md", "8 s"): "the accelerator probe's timeout",
    ("docs/inspect.md", "256 MiB"): "the memory the provider plans per sample",
    ("docs/reference.md", "2.5 x"): "the rule a parent's memoryMiB must meet",
    ("docs/reference.md", "8 MiB"): "a test's threshold and a buffer size tried",
    ("docs/reference.md", "16 MiB"): "the older file routes' cap",
    ("docs/reference.md", "0.5 s"): "the SDK's retry waits",
    ("docs/reference.md", "1 s"): "the SDK's retry waits",
    ("docs/snapshot-registry.md", "256 MiB"): "the children's size in the run",
    ("docs/tutorial.md", "300 s"): "the ceiling of the back-off",
    ("docs/layers/frontends.md", "4 MiB"): "the cap on a listing page",
}


@dataclass
class Block:
    page: Path
    line: int
    kind: str  # heading, table, item, paragraph
    text: str


def blocks(page: Path) -> list[Block]:
    """The page's headings, tables, list items and paragraphs, code blocks left out (their lines kept blank)."""
    text = FENCE.sub(lambda m: "\n" * m[0].count("\n"), page.read_text())
    out: list[Block] = []
    for n, line in enumerate(text.splitlines(), 1):
        kind = ("heading" if line.startswith("#") else "table" if line.startswith("|") else
                "item" if re.match(r"\s*(?:[-*+]|\d+\.)\s", line) else "paragraph")
        last = out[-1] if out else None
        if not line.strip():
            out.append(Block(page, n, "blank", ""))
        elif last and last.kind != "blank" and (kind == last.kind == "table" or kind == "paragraph" and
                                                last.kind in ("item", "paragraph")):
            last.text += "\n" + line
        else:
            out.append(Block(page, n, kind, line))
    return [b for b in out if b.kind != "blank"]


def measured(block: Block) -> list[str]:
    """The figures of a block that are measurements, not settings."""
    text = CODE.sub("``", block.text)
    found = []
    for m in FIGURE.finditer(text):
        clause = re.split(r"[.;,:(]\s|\n\s*[-*]\s", text[max(0, m.start() - 60):m.start()])[-1]
        if SETTING.search(clause) or SETTING.search(text[max(0, m.start() - 4):m.start()]) or \
                SETTING_AFTER.match(text[m.end():m.end() + 20]):
            continue
        if (block.page.relative_to(ROOT).as_posix(), m[0]) in SETTINGS:
            continue
        found.append(m[0])
    return found


def report_links(block: Block) -> list[str]:
    """The repository paths of the reports a block links (existing or not)."""
    here = block.page.parent.relative_to(ROOT).as_posix()
    paths = [posixpath.normpath(posixpath.join(here, t)) for t in LINK.findall(block.text) if "://" not in t]
    return [p for p in paths if p.startswith(REPORT_DIRS)]


def test_every_measured_figure_links_the_report_it_comes_from():
    """A block with a measured figure links an existing report, or is a table whose caption (the block before it)
    does; a heading holds no figure at all."""
    missing = []
    for page in PAGES:
        prev = None
        for b in blocks(page):
            figures = measured(b)
            where = f"{page.relative_to(ROOT)}:{b.line}"
            if b.kind == "heading" and FIGURE.search(CODE.sub("``", b.text)):
                missing.append(f"{where}: a figure in a heading: {b.text}")
            elif figures:
                links = report_links(b) + (report_links(prev) if b.kind == "table" and prev else [])
                if not any((ROOT / p).is_file() for p in links):
                    missing.append(f"{where}: {', '.join(figures)} without a link to its report")
            prev = b
    assert not missing, "\n".join(missing)


def test_every_linked_report_exists():
    """A link to a report names a file that is there (a renamed or never-committed report is a broken quote)."""
    broken = [f"{b.page.relative_to(ROOT)}:{b.line}: {p}" for page in PAGES for b in blocks(page)
              for p in report_links(b) if not (ROOT / p).is_file()]
    assert not broken, "\n".join(broken)


def test_the_figure_pattern():
    """What counts as a measured figure: a sample of both sides."""
    def figures(text: str) -> list[str]:
        return measured(Block(ROOT / "docs" / "x.md", 1, "paragraph", text))

    assert figures("fork p50 418 / 429 ms, pause 21.2 ms (3 reps), 1,500 fit at 12.0 MiB, 60x, ~15 % of a core") == \
        ["429 ms", "21.2 ms", "12.0 MiB", "60x", "15 %"]
    assert figures("one exec within 55-270 ms measured") == ["55-270 ms"]
    assert figures("Python 3.11, `sleep 5s`, a 512 MiB guest, default 60 s, at most 64 KiB, every 20 s, "
                   "`MAX_FRAME` (64 MiB), up to 1 GiB, <= 10 ms") == []
