"""Durations, one format everywhere (CLI flags, spec fields, settings): a number of seconds (`90`, `1.5`) or
numbers with units, largest first (`500ms`, `90s`, `5m`, `1h30m`, `2d`). Standard library only (the CLI's
hot path uses it)."""

from __future__ import annotations

import re

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
PART = r"[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h|d)"
PATTERN = rf"^(?:[0-9]+(?:\.[0-9]+)?|(?:{PART})+)$"  # for pydantic StringConstraints and JSON Schema
_FULL = re.compile(PATTERN)
_PARTS = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
EXAMPLES = "e.g. 90 (seconds), 90s, 5m, 1h30m"


def parse_duration(text: str | float | int) -> float:
    """`text` in seconds. Raises ValueError naming the format for anything else (negative, empty, `5 m`, `5x`)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text!r} is not a duration: it is negative")
        return float(text)
    s = str(text).strip()
    if not _FULL.match(s):
        raise ValueError(f"{text!r} is not a duration: use {EXAMPLES}")
    if s[-1].isdigit():
        return float(s)
    return sum(float(n) * UNITS[u] for n, u in _PARTS.findall(s))
