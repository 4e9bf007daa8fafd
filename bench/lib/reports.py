"""Dated benchmark reports: `<dir>/<YYYY-MM-DD>-<name>.json` (the raw result) and `.md` (the tables), plus the
host facts every report states (CPUs, load average before and after, what else was running)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path


def percentile(xs: list[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p % of the values at or below it (None for no values)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def host_facts() -> dict:
    """CPUs, the 1-minute load average, and how many QEMU and Python processes other sessions run right now."""
    try:
        out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, timeout=10).stdout
        ps = [Path(line.split()[0]).name for line in out.splitlines() if line.split()]
    except (OSError, subprocess.TimeoutExpired):
        ps = []
    return {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2),
            "qemu_processes": sum(1 for c in ps if c.startswith("qemu-system")),
            "python_processes": sum(1 for c in ps if c.startswith("python")),
            "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def write_report(directory: Path, name: str, result: dict, markdown: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y-%m-%d', time.gmtime())}-{name}"
    j, m = directory / f"{stem}.json", directory / f"{stem}.md"
    j.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    m.write_text(markdown)
    return j, m


def fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{unit}"
