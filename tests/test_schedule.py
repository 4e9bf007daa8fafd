"""tests/schedule.py's module order: long modules first, then by test count, benchmark smoke last."""

from __future__ import annotations

import pytest

from tests.schedule import LONG_FIRST, module_order

LONG = ("a_long.py", "b_long.py")


@pytest.mark.parametrize("modules, order", [
    ([("x.py", 3, False), ("b_long.py", 1, False), ("a_long.py", 1, False)], ["a_long.py", "b_long.py", "x.py"]),
    ([("few.py", 2, False), ("many.py", 40, False)], ["many.py", "few.py"]),  # unlisted: most tests first
    ([("bench.py", 9, True), ("x.py", 1, False)], ["x.py", "bench.py"]),  # benchmark smoke last
    ([("a_long.py", 1, True), ("x.py", 1, False), ("b_long.py", 1, True)], ["x.py", "a_long.py", "b_long.py"]),
    ([("same_b.py", 2, False), ("same_a.py", 2, False)], ["same_a.py", "same_b.py"]),  # ties: by path, stable
], ids=["long-first", "by-count", "bench-last", "long-bench-last-in-order", "ties"])
def test_module_order(modules, order):
    assert module_order(modules, LONG) == order


def test_the_long_modules_exist():
    """A renamed module left in LONG_FIRST would silently lose its place."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert [p for p in LONG_FIRST if not (root / p).is_file()] == []
    assert len(set(LONG_FIRST)) == len(LONG_FIRST)
