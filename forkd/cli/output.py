"""Rendering for the CLI: tables for people, json/yaml for scripts, errors on stderr with a hint (the standard
library alone: no rich to load before the first line)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from enum import StrEnum
from typing import Any

# the few styles the CLI's messages use, as `[name]text[/]`; any other bracket is text, printed as it is
STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_TAG = re.compile(r"\[(?:(" + "|".join(STYLES) + r")|/)\]")


def visible(text: str) -> str:
    """`text` without its style tags: what a pipe receives and what a table's widths count."""
    return _TAG.sub("", text)


class _Printer:
    """Lines for people on stdout or stderr: style tags as ANSI colours on a terminal (not with NO_COLOR), dropped
    on a pipe. Never wraps or truncates (a pipe is read by scripts and logs)."""

    def __init__(self, stderr: bool):
        self._stderr = stderr

    @property
    def file(self) -> Any:
        return sys.stderr if self._stderr else sys.stdout

    def _ansi(self, text: str) -> str:
        if not self.file.isatty() or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
            return visible(text)
        return _TAG.sub(lambda m: f"\x1b[{STYLES[m.group(1)]}m" if m.group(1) else "\x1b[0m", text)

    def print(self, *objects: Any) -> None:
        self.file.write(self._ansi(" ".join(str(o) for o in objects)) + "\n")

    def flush(self) -> None:
        self.file.flush()


out = _Printer(stderr=False)
err = _Printer(stderr=True)


def table(columns: list[tuple[str, str]], rows: list[list[str]], title: str | None = None) -> str:
    """Columns two spaces apart, each as wide as its widest cell (justify: left or right); a cell may hold
    several lines; the header bold."""
    cells = [[f"[bold]{h}[/]" for h, _ in columns], *[[str(c) for c in r] for r in rows]]
    split = [[c.split("\n") for c in r] for r in cells]
    widths = [max(len(visible(line)) for r in split for line in r[i]) for i in range(len(columns))]
    lines = [title] if title else []
    for r in split:
        for k in range(max(len(c) for c in r)):
            parts = []
            for i, (_, justify) in enumerate(columns):
                text = r[i][k] if k < len(r[i]) else ""
                pad = " " * (widths[i] - len(visible(text)))
                parts.append(pad + text if justify == "right" else text + pad)
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


class Fmt(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def emit(data: Any, fmt: Fmt, columns: list[tuple[str, str]] | None = None, rows: list[list[str]] | None = None,
         title: str | None = None) -> None:
    """Print `data` (plain data or wire models) as json/yaml, or `rows` as a table with `columns` (header, justify)."""
    data = _plain(data)
    if fmt == Fmt.json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    elif fmt == Fmt.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=True))
    else:
        out.print(table(columns or [], rows or [], title))


def old_spelling(old: str, new: str) -> None:
    """The warning an old spelling of a verb or flag prints (it still runs)."""
    err.print(f"[yellow]warning:[/] `{old}` is the old spelling of `{new}`; it still works, but use `{new}`")


class Progress:
    """Progress lines on stderr with elapsed seconds (stdout stays clean for -o json)."""

    def __init__(self, quiet: bool = False):
        self.t0 = time.monotonic()
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            err.print(f"[dim]{time.monotonic() - self.t0:6.1f}s[/] {msg}")


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def size(n: int | None) -> str:
    if not n:
        return "0"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _plain(data: Any) -> Any:
    """Wire models (pydantic) and child views as the JSON data they stand for, inside lists and dicts too."""
    if hasattr(data, "model_dump"):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [_plain(x) for x in data]
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    return data
