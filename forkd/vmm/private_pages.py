"""The guest pages a child wrote since its restore, read from its VMM's page tables: a diff branch's memory.

A child maps its snapshot's flat image `MAP_PRIVATE`: every guest page it never wrote is still the file's page
(shared with its siblings), and every page it wrote (or a device wrote for it) is a private copy of its own. So
the child's memory *now* is its snapshot's image plus exactly those private pages, and a branch of it needs only
them, not the whole of its RAM. They are found with Linux's `PAGEMAP_SCAN` ioctl on /proc/PID/pagemap (6.7+):
the pages in the RAM mapping that are present or swapped and not the file's (`PAGE_IS_FILE` inverted), as ranges,
in one call per 4,096 ranges. The scan costs what the mapping's page tables hold, not its size: a 1.5 GiB guest
that touched 200 MiB is walked over 200 MiB. They are read with `process_vm_readv` (up to 1,024 ranges a call),
straight into a buffer that goes to the data file. Swapped pages (an idle child paged out) are read back from
swap by the read itself.

The caller stops the VM first and resumes it afterwards (forkd.vmm.diff_capture says what may still write guest
RAM meanwhile, and how the caller keeps it from doing so).

Output, the store's layer format (forkd.store.chain): `pages` holds little-endian uint32 page numbers ascending,
`data` those pages' 4 KiB contents in the same order. A page whose copy equals the image's page is still listed;
the store drops it when it seals the layer.

Needs ptrace access to the VMM (root: a VMM that dropped to its own uid with `-runas` is not dumpable, so not even
that uid may read it) and Linux 6.7+ for PAGEMAP_SCAN (`PagesUnavailable` otherwise, naming the kernel).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from array import array
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.vmm.libc import LIBC, UIO_MAXIOV, Iovec, iovecs

PAGE = 4096
# <linux/fs.h>: _IOWR('f', 16, struct pm_scan_arg) with sizeof(struct pm_scan_arg) == 96
PAGEMAP_SCAN = (3 << 30) | (96 << 16) | (ord("f") << 8) | 16
PAGE_IS_FILE, PAGE_IS_PRESENT, PAGE_IS_SWAPPED = 1 << 2, 1 << 3, 1 << 4
REGIONS = 4096  # ranges per PAGEMAP_SCAN call
IOV_BATCH = UIO_MAXIOV  # ranges per process_vm_readv call
READ_BATCH = 64 << 20  # bytes read per process_vm_readv batch before they go to the data file
MAX_PAGE_NUMBER = 0xFFFFFFFF  # the layer format's page numbers are uint32 (16 TiB of guest RAM)
SPARE_MAX = 16 << 20  # bytes: a buffer up to this size is kept, faulted in, for this process's next capture

_spare: list[bytearray] = []  # at most one: faulting a new buffer in costs ~2 us a page on this host
_spare_lock = threading.Lock()


class PagesUnavailable(ForkdError):
    pass


class _ScanArg(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages", "category_inverted",
        "category_mask", "category_anyof_mask", "return_mask")]


class _Region(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


@dataclass(frozen=True)
class Mapping:
    """Where a VMM maps guest RAM: [start, end) in its address space."""

    start: int
    end: int


def find_mapping(pid: int, path: Path, size: int) -> Mapping:
    """The VMM's mapping of `path` (the child's flat image): exactly one, of the whole file (`size` bytes from
    offset 0), else PagesUnavailable (a split or partial mapping would misplace pages). Only the lines that end
    in the path are parsed (QEMU has hundreds of mappings; this runs just before a diff branch's pause)."""
    with open(f"/proc/{pid}/maps", "rb") as f:
        maps = f.read()
    want = b" " + os.fsencode(path) + b"\n"
    found: list[Mapping] = []
    at = maps.find(want)
    while at >= 0:
        line = maps[maps.rfind(b"\n", 0, at) + 1:at + len(want)]
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].rstrip(b"\n") == os.fsencode(path):
            start, end = (int(x, 16) for x in parts[0].split(b"-"))
            whole = int(parts[2], 16) == 0 and end - start == size
            found.append(Mapping(start, end) if whole else Mapping(0, 0))  # else: there, but not the whole image
        at = maps.find(want, at + len(want))
    if len(found) == 1 and found[0].end:
        return found[0]
    raise PagesUnavailable(f"VMM {pid} does not map {path} once and whole ({len(found)} mappings of it)",
                           hint="the child's memory image is not the one its record names; branch it with "
                                "--mode live or --mode full")


def private_ranges(pid: int, m: Mapping) -> list[tuple[int, int]]:
    """[start, end) page numbers (relative to the mapping) of the pages the VMM holds a private copy of."""
    return [((a - m.start) // PAGE, (b - m.start) // PAGE) for a, b in
            _scan(pid, m.start, m.end, mask=PAGE_IS_FILE, inverted=PAGE_IS_FILE,
                  anyof=PAGE_IS_PRESENT | PAGE_IS_SWAPPED)]


def swapped_spans(pid: int, start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) addresses of the pages of `pid` between `start` and `end` that are in swap."""
    return _scan(pid, start, end, mask=PAGE_IS_SWAPPED, inverted=0, anyof=0)


def _scan(pid: int, start: int, end: int, *, mask: int, inverted: int, anyof: int) -> list[tuple[int, int]]:
    """PAGEMAP_SCAN of `pid` over [start, end): the [start, end) addresses of the pages whose categories (XOR
    `inverted`) include all of `mask` and, if `anyof`, one of it; adjacent runs merged."""
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        vec = (_Region * REGIONS)()
        arg = _ScanArg(size=ctypes.sizeof(_ScanArg), start=start, end=end, vec=ctypes.addressof(vec),
                       vec_len=REGIONS, category_inverted=inverted, category_mask=mask, category_anyof_mask=anyof,
                       return_mask=mask)  # regions split only where `mask`'s categories change
        out: list[tuple[int, int]] = []
        while arg.start < end:
            n = LIBC.ioctl(fd, PAGEMAP_SCAN, ctypes.byref(arg))
            if n < 0:
                err = ctypes.get_errno()
                raise PagesUnavailable(f"PAGEMAP_SCAN on VMM {pid}: {os.strerror(err)}",
                                       hint="a diff branch needs Linux 6.7 or later (this kernel: "
                                            f"{os.uname().release}); use --mode live or --mode full"
                                       if err in (errno.ENOTTY, errno.EINVAL) else None)
            words = memoryview(vec).cast("B").cast("Q")[:3 * n]  # (start, end, categories) per region
            for first, last in zip(words[0::3].tolist(), words[1::3].tolist(), strict=True):
                if out and first <= out[-1][1]:  # adjacent, or re-reported from inside the last range: merged
                    out[-1] = (out[-1][0], max(out[-1][1], last))
                else:
                    out.append((first, last))
            if arg.walk_end <= arg.start:
                break
            arg.start = arg.walk_end
        return out
    finally:
        os.close(fd)


def read_spans(pid: int, spans: list[tuple[int, int]], buf: bytearray) -> int:
    """Read the [start, end) address spans of `pid` into `buf`, back to back (they must fit); the bytes read,
    short if a span was unmapped meanwhile."""
    local = (ctypes.c_char * len(buf)).from_buffer(buf)
    off = 0
    for i in range(0, len(spans), IOV_BATCH):
        batch = spans[i:i + IOV_BATCH]
        n_bytes = sum(b - a for a, b in batch)
        remote = iovecs([(a, b - a) for a, b in batch])
        liov = Iovec(ctypes.addressof(local) + off, n_bytes)
        got = LIBC.process_vm_readv(pid, ctypes.byref(liov), 1, remote, len(batch), 0)
        if got < 0:
            err = ctypes.get_errno()
            raise PagesUnavailable(f"reading the memory of VMM {pid}: {os.strerror(err)}")
        off += got
        if got != n_bytes:
            break
    return off


def _read(pid: int, m: Mapping, ranges: list[tuple[int, int]], buf: bytearray) -> None:
    """Read `ranges` (page numbers) of the mapping into `buf`, back to back."""
    want = sum(b - a for a, b in ranges) * PAGE
    got = read_spans(pid, [(m.start + a * PAGE, m.start + b * PAGE) for a, b in ranges], buf)
    if got != want:
        raise PagesUnavailable(f"reading guest pages of VMM {pid}: {os.strerror(errno.EIO)} (short read: {got} of "
                               f"{want} bytes)")


class PageCopy:
    """A copy of a VMM's private guest pages, in three steps so that only the second runs while the VM is stopped:
    `prepare()` sizes the buffer from a first scan and faults it in; `take(data)` scans again and reads every page
    (into the buffer; pages beyond READ_BATCH go to `data` batch by batch, still within the pause); `finish(pages)`
    writes what the buffer holds and the page numbers. Returns of `finish`: the number of pages."""

    def __init__(self, pid: int, mapping: Mapping):
        self.pid, self.mapping = pid, mapping
        self.buf = bytearray()
        self.pending = 0  # bytes of `buf` not yet written
        self.numbers = array("I")
        self.fd: int | None = None

    def prepare(self, written: int | None = None) -> None:
        """`written`: the pages the VMM held privately a moment ago, if just counted (else scanned here)."""
        guess = written if written is not None else sum(b - a for a, b in private_ranges(self.pid, self.mapping))
        need = min(READ_BATCH, (guess + guess // 4 + 256) * PAGE)
        self.buf = _spare_buffer(need) or _buffer(need)  # an earlier capture's (faulted in) if it is big enough

    def take(self, data: Path) -> None:
        self.fd = os.open(data, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        ranges = private_ranges(self.pid, self.mapping)
        if ranges and ranges[-1][1] - 1 > MAX_PAGE_NUMBER:
            raise PagesUnavailable(f"guest RAM of VMM {self.pid} is larger than a layer can describe")
        total = sum(b - a for a, b in ranges) * PAGE
        if total > len(self.buf):  # more than the buffer holds: grown here, inside the pause
            self.buf = bytearray(min(READ_BATCH, total))
        for batch, n in batches(ranges, len(self.buf) // PAGE):
            if self.pending:
                self._write()
            _read(self.pid, self.mapping, batch, self.buf)
            self.pending = n * PAGE
            for a, b in batch:
                self.numbers.extend(range(a, b))

    def _write(self) -> None:
        view = memoryview(self.buf)[:self.pending]
        while view:
            view = view[os.write(self.fd, view):]
        self.pending = 0

    def discard(self) -> None:
        """Drop the buffer (kept for the next capture if it is small enough) and close the data file."""
        _keep(self.buf)
        self.buf = bytearray()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def finish(self, pages: Path) -> int:
        try:  # scratch files, not fsynced: the store writes and syncs what it keeps of them
            if self.pending:
                self._write()
        finally:
            self.discard()
        fd = os.open(pages, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            self.numbers.tofile(f)
        return len(self.numbers)


def _spare_buffer(size: int) -> bytearray:
    """The spare buffer (see `_keep`) if it holds `size` bytes, else an empty one. It still holds an earlier
    capture's pages beyond what the next one reads; only the `pending` bytes a capture read are ever written out."""
    with _spare_lock:
        return _spare.pop() if _spare and len(_spare[0]) >= size else bytearray()


def _buffer(size: int) -> bytearray:
    """A new buffer of at least `size` bytes, zero-filled, so every page is touched before the VM stops."""
    if size <= SPARE_MAX:  # rounded up to a power of two, so a source that wrote a few pages more reuses it
        size = 1 << (size - 1).bit_length()
    return bytearray(size)


def _keep(buf: bytearray) -> None:
    """Keep `buf` as the spare buffer if it is within SPARE_MAX and bigger than the one kept."""
    if not buf or len(buf) > SPARE_MAX:
        return
    with _spare_lock:
        if not _spare or len(_spare[0]) < len(buf):
            _spare[:] = [buf]


def batches(ranges: list[tuple[int, int]], per: int):
    """Split ranges into runs of at most `per` pages (a range longer than that is cut)."""
    batch: list[tuple[int, int]] = []
    size = 0
    for a, b in ranges:
        while a < b:
            take = min(b - a, per - size)
            batch.append((a, a + take))
            size += take
            a += take
            if size == per:
                yield batch, size
                batch, size = [], 0
    if batch:
        yield batch, size


def probe() -> tuple[bool, str]:
    """Whether this kernel finds a process's private pages (what a diff branch needs): two anonymous pages of our
    own, one written, must scan as exactly that one. (available, what was seen)."""
    mm = mmap.mmap(-1, 2 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm[0] = 1
        anchor = ctypes.c_char.from_buffer(mm)
        start = ctypes.addressof(anchor)
        del anchor  # the mapping may be closed only once no ctypes object points into it
        got = private_ranges(os.getpid(), Mapping(start, start + 2 * PAGE))
    except PagesUnavailable as exc:
        return False, exc.message
    finally:
        mm.close()
    if got != [(0, 1)]:
        return False, f"PAGEMAP_SCAN found {got} where one written page was expected"
    return True, f"PAGEMAP_SCAN finds written pages (Linux {os.uname().release})"
