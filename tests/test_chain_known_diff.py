"""chain.write_known_diff: a diff branch's captured pages stored as a layer, comparing only those pages with the
parent's image (real files; no VM needed)."""

from __future__ import annotations

from array import array

import pytest

from forkd.store import chain
from forkd.store.chain import DATA_FILE, PAGE, PAGES_FILE, ChainError


def _candidates(d, pages, data):
    d.mkdir()
    (d / PAGES_FILE).write_bytes(array("I", pages).tobytes())
    (d / DATA_FILE).write_bytes(data)
    return d


def test_only_pages_that_differ_are_kept(tmp_path):
    base = tmp_path / "base.mem"
    base.write_bytes(bytes(PAGE) + b"\1" * PAGE + bytes(2 * PAGE))
    cand = _candidates(tmp_path / "cand", [1, 2], b"\1" * PAGE + b"\2" * PAGE)  # page 1 unchanged, page 2 new
    out = tmp_path / "out"
    out.mkdir()
    assert chain.write_known_diff(base, cand, out) == (1, PAGE)
    assert list(chain.read_pages(out)) == [2] and (out / DATA_FILE).read_bytes() == b"\2" * PAGE


@pytest.mark.parametrize("pages,data,what", [
    ([2, 1], 2 * PAGE, "out of order"),
    ([1, 1], 2 * PAGE, "out of order"),
    ([9], PAGE, "beyond"),
    ([0, 1], PAGE, "fewer pages of data"),
])
def test_misshapen_candidates_are_refused(tmp_path, pages, data, what):
    base = tmp_path / "base.mem"
    base.write_bytes(bytes(4 * PAGE))
    cand = _candidates(tmp_path / "cand", pages, b"\3" * data)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ChainError, match=what):
        chain.write_known_diff(base, cand, out)
