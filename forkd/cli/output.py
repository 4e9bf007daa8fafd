"""Rendering for the CLI: tables for people, json/yaml for scripts, errors on stderr with a hint."""

from __future__ import annotations

import json
import sys
import time
from enum import StrEnum
from typing import Any


class _Console:
    """A rich Console made on first use (rich is loaded only by a command that prints through it). Piped output is
    for scripts and logs: never truncate it to an imaginary 80-column terminal."""

    def __init__(self, stderr: bool):
        self._stderr, self._console = stderr, None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            tty = (sys.stderr if self._stderr else sys.stdout).isatty()
            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True,
                                    width=None if tty else 240)
        return getattr(self._console, name)


out = _Console(stderr=False)
err = _Console(stderr=True)


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
        from rich.table import Table

        t = Table(title=title, box=None, pad_edge=False, header_style="bold")
        for head, justify in columns or []:
            t.add_column(head, justify=justify)
        for r in rows or []:
            t.add_row(*r)
        out.print(t)


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
