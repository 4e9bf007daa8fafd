"""Paging out an idle VMM's own memory: `process_madvise(MADV_PAGEOUT)` over the VMM's private mappings, so an idle
child costs the host what its compressed pages cost in the host's swap (zram) instead of their full size.

Scope "private" (the default): every private mapping but the kernel's own ([vdso], [vvar], [vsyscall]): the
anonymous ones (QEMU's heap, TCG's translation buffer, thread stacks) and the pages the VMM copied on write in its
file mappings (the guest pages this child wrote, in the snapshot's memory file mapping; QEMU's and its libraries'
data). Scope "anon": the anonymous mappings only (what bench/density.py compares it with). Either way the kernel
reclaims only pages no other process maps: the snapshot pages this child shares with its siblings, and QEMU's code,
stay where they are. It needs swap for anonymous pages (without swap the call moves nothing: `swap_total_kib()`).
A paged-out child answers its next request once its pages fault back in from swap.

Needs Linux 5.10+ (process_madvise), CAP_SYS_NICE and ptrace access to the VMM (root has both; a VMM that dropped to
its own uid is still the daemon's to advise). Whether to page out, and when, is forkd.core.idle's decision.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from forkd.base.errors import ForkdError
from forkd.base.procs import start_time
from forkd.vmm.libc import LIBC, UIO_MAXIOV, iovecs

SYS_PROCESS_MADVISE = 440  # x86_64 (and every architecture since 5.10 uses the same number in the unified table)
MADV_PAGEOUT = 21
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


def _wanted(name: str, scope: str) -> bool:
    anon = name in ANON_NAMES or name.startswith("[anon:")
    return anon if scope == "anon" else name not in KERNEL_NAMES


def private_ranges(pid: int, scope: str = "private") -> list[tuple[int, int]]:
    """(start, length) of the private mappings of `pid` in `scope` (from /proc/PID/maps, the kernel's own list)."""
    out = []
    with open(f"/proc/{pid}/maps", "rb") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            name = fields[5].strip().decode(errors="replace") if len(fields) > 5 else ""
            if fields[1][3:4] != b"p" or not _wanted(name, scope):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split(b"-"))
            out.append((lo, hi - lo))
    return out


def rss_anon_kib(pid: int) -> int:
    """RssAnon: the process's resident anonymous pages (copied-on-write pages of file mappings included)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


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


def page_out(pid: int, started: int | None, scope: str = "private") -> PagedOut:
    """Ask the kernel to reclaim the private memory of the VMM `pid` (which must still be the process that
    started at `started`: a pidfd pins it, and the start time is checked after the pidfd is open)."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r} is not one of {SCOPES}")
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise ForkdError(f"VMM {pid} is gone", hint="the child stopped; nothing to page out") from None
    try:
        if started is not None and start_time(pid) != started:
            raise ForkdError(f"pid {pid} is no longer the child's VMM", hint="the child stopped; nothing to do")
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
