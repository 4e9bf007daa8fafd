"""Kernel same-page merging (KSM) for VMMs: off unless FORKD_VMM_KSM=1 (a page-dedup timing side channel between
children: SECURITY.md section 9).

Two switches decide whether a VMM's pages can be merged with another process's:
  * the guest RAM mapping: QEMU marks it MADV_MERGEABLE unless its memory backend says `merge=off`, which
    qemu_argv writes for every VMM while KSM is off (QEMU's own default is on, so a host whose admin runs ksmd
    would otherwise merge children's guest pages across tenants);
  * the rest of the process (heap, TCG's code buffer): only with the process-wide PR_SET_MEMORY_MERGE (Linux 6.4+),
    which a process passes on through fork and exec. forkd sets it on itself just before it starts a VMM while
    FORKD_VMM_KSM=1 and clears it otherwise (no preexec hook: the daemon has threads), so VMMs inherit it.
Neither starts the kernel's scanner: /sys/kernel/mm/ksm/run is the host admin's (`forkd doctor` says its state).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.vmm.libc import LIBC

PR_SET_MEMORY_MERGE = 67
PR_GET_MEMORY_MERGE = 68
KSM_SYSFS = Path("/sys/kernel/mm/ksm")
_lock = threading.Lock()


def _prctl(*args: int) -> int:
    res = LIBC.prctl(*(ctypes.c_ulong(a) for a in (*args, *([0] * (5 - len(args))))))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return res


def inherit_merge(on: bool) -> None:
    """Make the VMMs this process starts from now on mergeable (or not) as whole processes."""
    with _lock:
        try:
            if bool(_prctl(PR_GET_MEMORY_MERGE)) != on:
                _prctl(PR_SET_MEMORY_MERGE, int(on))
        except OSError as exc:
            if not on:  # a kernel without the call cannot have set it either
                return
            raise ForkdError(f"FORKD_VMM_KSM=1 needs Linux 6.4 or later (PR_SET_MEMORY_MERGE failed: {exc.strerror})",
                             hint="unset FORKD_VMM_KSM, or run forkd on a newer kernel") from exc


def merge_any(pid: int) -> bool | None:
    """Whether process `pid` is mergeable as a whole (None: the kernel does not say, or it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/ksm_stat").read_text().splitlines():
            if line.startswith("ksm_merge_any:"):
                return line.split(":", 1)[1].strip() == "yes"
    except OSError:
        return None
    return None


def scanner_state() -> dict[str, int] | None:
    """The kernel scanner's switch and counters (None without KSM): run, pages_sharing, full_scans..."""
    if not (KSM_SYSFS / "run").exists():
        return None
    out = {}
    for name in ("run", "pages_shared", "pages_sharing", "full_scans", "pages_to_scan", "sleep_millisecs"):
        try:
            out[name] = int((KSM_SYSFS / name).read_text())
        except (OSError, ValueError):
            continue
    return out
