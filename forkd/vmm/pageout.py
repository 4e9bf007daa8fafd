"""Paging out an idle VMM's own memory: `process_madvise(MADV_PAGEOUT)` over the VMM's private mappings, so an idle
child costs the host what its compressed pages cost in the host's swap (zram) instead of their full size.

Scope "private" (the default): every private mapping but the kernel's own ([vdso], [vvar], [vsyscall]): the
anonymous ones (QEMU's heap, TCG's translation buffer, thread stacks) and the pages the VMM copied on write in its
file mappings (the guest pages this child wrote, in the snapshot's memory file mapping; QEMU's and its libraries'
data). Scope "anon": the anonymous mappings only (what bench/density.py compares it with). Either way the kernel
reclaims only pages no other process maps: the snapshot pages this child shares with its siblings, and QEMU's code,
stay where they are. It needs swap for anonymous pages (without swap the call moves nothing: `swap_total_kib()`).
A paged-out child answers its next request once its pages fault back in from swap; `page_in` reads them back
on another thread meanwhile (forkd.sandbox.child starts it when a request comes).

Needs Linux 5.10+ (process_madvise), CAP_SYS_NICE and ptrace access to the VMM (root has both; a VMM that dropped to
its own uid is still the daemon's to advise). Whether to page out, and when, is forkd.core.idle's decision.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.procs import start_time
from forkd.vmm.libc import LIBC, UIO_MAXIOV, iovecs
from forkd.vmm.private_pages import PAGE, PagesUnavailable, batches, read_spans, swapped_spans

SYS_PROCESS_MADVISE = 440  # x86_64 (and every architecture since 5.10 uses the same number in the unified table)
MADV_PAGEOUT = 21
PAGE_IN_CHUNK = 1 << 20  # bytes read back per process_vm_readv call of a page-in
PAGE_IN_MAX_KIB = 256 << 10  # a page-in reads back at most this much (an idle TCG child has ~20-40 MiB in swap)
IOV_BATCH = UIO_MAXIOV // 2
ANON_NAMES = ("", "[heap]", "[stack]")  # anonymous mappings as /proc/PID/maps names them (plus "[anon:...]")
KERNEL_NAMES = ("[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]")  # special mappings madvise refuses (EINVAL)
SCOPES = ("private", "anon")


@dataclass(frozen=True)
class PagedOut:
    """What one page-out asked for and what it moved."""

    advised_kib: int  # the mappings advised (their whole size, touched or not)
    rss_before_kib: int  # the VMM's RssAnon before
    rss_after_kib: int  # and after: the difference went to swap

    @property
    def moved_kib(self) -> int:
        return max(0, self.rss_before_kib - self.rss_after_kib)


def meminfo_kib(field: str) -> int:
    """One /proc/meminfo figure in KiB (0 if this kernel has no such field)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def swap_total_kib() -> int:
    """The host's swap (SwapTotal): 0 means a page-out can move nothing."""
    return meminfo_kib("SwapTotal")


def swap_devices() -> list[str]:
    """The host's active swap devices and files (/proc/swaps; a name with a space is escaped there as \\040); none
    on a kernel without swap support (no /proc/swaps)."""
    try:
        with open("/proc/swaps") as f:
            return [line.split()[0] for line in f.readlines()[1:] if line.strip()]
    except OSError:
        return []


def zram_backing(device: str) -> str:
    """The backing device a zram device writes idle or incompressible pages to: "none" when it has none, or when
    its kernel has no zram writeback at all (no `backing_dev` file); "unknown" when the device is not in sysfs or
    the file cannot be read (counted as a disk)."""
    sysfs = Path("/sys/block") / Path(device).name
    try:
        return (sysfs / "backing_dev").read_text().strip() or "none"
    except FileNotFoundError:
        return "none" if sysfs.is_dir() else "unknown"
    except OSError:
        return "unknown"


def not_in_ram(devices: list[str], backing: Callable[[str], str] = zram_backing) -> list[str]:
    """The swap devices of `devices` whose pages may reach storage that outlives the host's power: anything but
    zram (a disk, a file, a loop device), and a zram device with a backing device (writeback) or whose backing
    device cannot be read."""
    return [d for d in devices if not (d.startswith("/dev/zram") and backing(d) == "none")]


def _wanted(name: str, scope: str) -> bool:
    anon = name in ANON_NAMES or name.startswith("[anon:")
    return anon if scope == "anon" else name not in KERNEL_NAMES


def private_ranges(pid: int, scope: str = "private", code_first: bool = False,
                   code_only: bool = False) -> list[tuple[int, int]]:
    """(start, length) of the private mappings of `pid` in `scope` (from /proc/PID/maps, the kernel's own list);
    with `code_first`, the executable ones (TCG's translation buffer) come first; `code_only`: only those."""
    out = []
    with open(f"/proc/{pid}/maps", "rb") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            name = fields[5].strip().decode(errors="replace") if len(fields) > 5 else ""
            if fields[1][3:4] != b"p" or not _wanted(name, scope):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split(b"-"))
            out.append((fields[1][2:3] != b"x", lo, hi - lo))
    if code_first:
        out.sort(key=lambda r: r[0])  # stable: address order within each kind
    return [(lo, n) for data, lo, n in out if not (code_only and data)]


def status_kib(pid: int, field: str) -> int:
    """One /proc/PID/status figure in KiB (RssAnon, VmSwap, ...; 0 if absent)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_anon_kib(pid: int) -> int:
    """RssAnon: the process's resident anonymous pages (copied-on-write pages of file mappings included)."""
    return status_kib(pid, "RssAnon")


def _advise(pidfd: int, chunk: list[tuple[int, int]]) -> int:
    iov = iovecs(chunk)
    res = LIBC.syscall(ctypes.c_long(SYS_PROCESS_MADVISE), ctypes.c_int(pidfd), iov, ctypes.c_size_t(len(chunk)),
                       ctypes.c_int(MADV_PAGEOUT), ctypes.c_uint(0))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return res


def _madvise(pidfd: int, ranges: list[tuple[int, int]]) -> None:
    """Advise every range; a range the VMM unmapped since /proc/PID/maps was read (ENOMEM) is skipped."""
    for i in range(0, len(ranges), IOV_BATCH):
        chunk = ranges[i:i + IOV_BATCH]
        try:
            _advise(pidfd, chunk)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            for one in chunk:  # one at a time, so a vanished mapping costs only itself
                try:
                    _advise(pidfd, [one])
                except OSError as again:
                    if again.errno != errno.ENOMEM:
                        raise


def _pidfd(pid: int, started: int | None) -> int:
    """A pidfd of the VMM `pid`, which must still be the process that started at `started` (checked after the
    pidfd is open, which pins it)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise ForkdError(f"VMM {pid} is gone", hint="the child stopped; nothing to do") from None
    if started is not None and start_time(pid) != started:
        os.close(pidfd)
        raise ForkdError(f"pid {pid} is no longer the child's VMM", hint="the child stopped; nothing to do")
    return pidfd


def page_out(pid: int, started: int | None, scope: str = "private") -> PagedOut:
    """Ask the kernel to reclaim the private memory of the VMM `pid` (which must still be the process that
    started at `started`)."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r} is not one of {SCOPES}")
    pidfd = _pidfd(pid, started)
    try:
        before = rss_anon_kib(pid)
        ranges = private_ranges(pid, scope)
        try:
            _madvise(pidfd, ranges)
        except OSError as exc:
            raise ForkdError(f"process_madvise(MADV_PAGEOUT) on VMM {pid} failed: {exc.strerror}",
                             hint="needs Linux 5.10+ and CAP_SYS_NICE (run the daemon as root), or set "
                                  "FORKD_IDLE_PAGEOUT_SECS=0") from None
        return PagedOut(sum(n for _, n in ranges) // 1024, before, rss_anon_kib(pid))
    finally:
        os.close(pidfd)


def page_in(pid: int, started: int | None, limit_kib: int = PAGE_IN_MAX_KIB, code_only: bool = False) -> int:
    """Bring the VMM's swapped memory back now: the pages of its private mappings that are in swap (PAGEMAP_SCAN)
    are read with `process_vm_readv`, which faults each one back in and maps it, so the VMM touches them later
    without a fault; executable mappings (TCG's translation buffer) first, then (unless `code_only`) the rest in
    address order, guest pages it had copied included; at most `limit_kib` (a big child swapped under memory
    pressure is not pulled back whole by one request). Returns the KiB read back."""
    pidfd = _pidfd(pid, started)
    try:
        buf, done = bytearray(PAGE_IN_CHUNK), 0
        for lo, n in private_ranges(pid, "private", code_first=True, code_only=code_only):
            pages = [(a // PAGE, b // PAGE) for a, b in swapped_spans(pid, lo, lo + n)]
            for batch, _ in batches(pages, PAGE_IN_CHUNK // PAGE):  # what is read is dropped: mapping it was the point
                if done >= limit_kib * 1024:
                    return done // 1024
                with contextlib.suppress(PagesUnavailable):  # unmapped since it was scanned: the rest still counts
                    done += read_spans(pid, [(a * PAGE, b * PAGE) for a, b in batch], buf)
        return done // 1024
    except PagesUnavailable as exc:  # the scan itself failed (a kernel without PAGEMAP_SCAN)
        raise ForkdError(f"page-in of VMM {pid}: {exc.message}") from None
    finally:
        os.close(pidfd)
