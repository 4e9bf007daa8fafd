"""forkd.vmm.private_pages on a real mapping of this test's own process (the kernel's PAGEMAP_SCAN and
process_vm_readv, as a diff branch uses them on a VMM): a file mapped MAP_PRIVATE, some pages written.

The VM-level behaviour (a diff branch of a running child) is in tests/test_branch_diff.py."""

from __future__ import annotations

import ctypes
import mmap
import os
from array import array

import pytest

from forkd.vmm import private_pages
from forkd.vmm.private_pages import PAGE, PageCopy, find_mapping, private_ranges

PAGES = 16


@pytest.fixture
def mapped(tmp_path):
    """(path, mmap, Mapping) of a 16-page file of 0xAA bytes, mapped MAP_PRIVATE by this process."""
    if not private_pages.probe()[0]:
        pytest.skip(f"this kernel has no PAGEMAP_SCAN: {private_pages.probe()[1]}")
    path = tmp_path / "image.mem"
    path.write_bytes(b"\xaa" * PAGES * PAGE)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), PAGES * PAGE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    yield path, mm, find_mapping(os.getpid(), path, PAGES * PAGE)
    mm.close()


def _take(m, tmp_path, name: str) -> tuple[list[int], bytes]:
    copy = PageCopy(os.getpid(), m)
    copy.prepare()
    copy.take(tmp_path / f"{name}.data")
    n = copy.finish(tmp_path / f"{name}.pages")
    numbers = array("I")
    numbers.frombytes((tmp_path / f"{name}.pages").read_bytes())
    assert len(numbers) == n
    return list(numbers), (tmp_path / f"{name}.data").read_bytes()


def test_only_the_written_pages_are_found_and_read(mapped, tmp_path):
    path, mm, m = mapped
    for page, byte in ((1, 0x11), (5, 0x55), (6, 0x66)):
        mm[page * PAGE:(page + 1) * PAGE] = bytes([byte]) * PAGE
    _ = mm[9 * PAGE]  # read, not written: still the file's page
    assert private_ranges(os.getpid(), m) == [(1, 2), (5, 7)]
    numbers, data = _take(m, tmp_path, "first")
    assert numbers == [1, 5, 6]
    assert data == b"\x11" * PAGE + b"\x55" * PAGE + b"\x66" * PAGE


def test_a_reused_buffer_never_leaks_an_earlier_capture(mapped, tmp_path, monkeypatch):
    """The second capture reuses the first one's buffer (kept, faulted in: no new buffer is made for it); its data
    file holds its own pages only, never the rest of what the buffer held."""
    path, mm, m = mapped
    for page in range(8):
        mm[page * PAGE:(page + 1) * PAGE] = b"\x77" * PAGE
    assert _take(m, tmp_path, "big")[0] == list(range(8))
    made = []
    monkeypatch.setattr(private_pages, "_buffer", lambda size: made.append(size) or bytearray(size))
    with open(path, "rb") as f:  # a second private mapping: one page written
        mm2 = mmap.mmap(f.fileno(), PAGES * PAGE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        anchor = ctypes.c_char.from_buffer(mm2)
        start = ctypes.addressof(anchor)
        del anchor
        mm2[3 * PAGE:4 * PAGE] = b"\x33" * PAGE
        numbers, data = _take(private_pages.Mapping(start, start + PAGES * PAGE), tmp_path, "small")
        assert numbers == [3] and data == b"\x33" * PAGE
        assert made == []  # the kept buffer (still holding the 0x77 pages) was the one read into
    finally:
        mm2.close()


def test_a_mapping_that_is_not_the_whole_image_is_refused(mapped, tmp_path):
    path, _, _ = mapped
    with pytest.raises(private_pages.PagesUnavailable, match="once and whole"):
        find_mapping(os.getpid(), path, PAGES * PAGE * 2)
    with pytest.raises(private_pages.PagesUnavailable, match="0 mappings"):
        find_mapping(os.getpid(), tmp_path / "not-mapped.mem", PAGE)


@pytest.mark.parametrize("regions", [1, 2, 3, 4096])
def test_ranges_come_in_order_without_overlap_however_many_scans_they_take(mapped, monkeypatch, regions):
    """More written ranges than one PAGEMAP_SCAN call returns (REGIONS): the next call starts where the kernel says
    the walk ended, which may be inside a range already returned; the ranges still come once each, ascending."""
    path, mm, m = mapped
    written = [p for p in range(PAGES) if p % 3 != 1]  # 0, 2-3, 5-6, ... : many ranges, some two pages long
    for page in written:
        mm[page * PAGE:(page + 1) * PAGE] = b"\x01" * PAGE
    monkeypatch.setattr(private_pages, "REGIONS", regions)
    ranges = private_ranges(os.getpid(), m)
    pages = [p for a, b in ranges for p in range(a, b)]
    assert pages == written, ranges
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(ranges, ranges[1:], strict=False)), ranges  # merged, apart
