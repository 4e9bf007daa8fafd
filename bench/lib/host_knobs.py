"""Host-wide knobs a density variant turns for its rounds and puts back after (bench/density.py --compare): the
kernel's KSM scanner, and an anonymous mTHP size."""

from __future__ import annotations

import time
from pathlib import Path

from forkd.base.errors import ForkdError
from lib.sweeper import progress

KSM = Path("/sys/kernel/mm/ksm")
MTHP = Path("/sys/kernel/mm/transparent_hugepage")
KSM_SCAN = {"pages_to_scan": "1000", "sleep_millisecs": "20", "run": "1"}  # ~195 MiB/s scanned while it runs


class KsmScanner:
    """For a variant with FORKD_VMM_KSM=1: the kernel's scanner on (KSM_SCAN; host-wide, put back as it was when
    the variant ends), `settle` waits for two full scans after the children started, and `pids` (ksmd) are added
    to the children's idle CPU, since merging is work the host does for them."""

    def __enter__(self) -> KsmScanner:
        if not (KSM / "run").exists():
            raise ForkdError("the ksm variant needs a kernel with KSM (/sys/kernel/mm/ksm)")
        self.saved = {k: (KSM / k).read_text().strip() for k in KSM_SCAN}
        for k, v in KSM_SCAN.items():
            (KSM / k).write_text(v)
        self.pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _comm(d) == "ksmd"]
        progress(f"KSM scanner on ({KSM_SCAN}; was {self.saved}); ksmd pid {self.pids}")
        return self

    def __exit__(self, *exc) -> None:
        for k in ("run", *[k for k in self.saved if k != "run"]):
            (KSM / k).write_text(self.saved[k])

    def settle(self, limit_s: float = 240.0) -> dict:
        start, deadline = int((KSM / "full_scans").read_text()), time.monotonic() + limit_s
        while int((KSM / "full_scans").read_text()) < start + 2 and time.monotonic() < deadline:
            time.sleep(1.0)
        state = {k: int((KSM / k).read_text()) for k in ("pages_shared", "pages_sharing", "full_scans")}
        progress(f"KSM after two full scans: {state}")
        return state


class HostMthp:
    """For a variant with `mthp_kib`: the host's anonymous mTHP of that size set to `madvise` (MADV_HUGEPAGE mappings
    may use it, the code buffer included) while the variant runs, then put back as it was."""

    def __init__(self, kib: str):
        self.path = MTHP / f"hugepages-{kib}kB" / "enabled"
        if not self.path.exists():
            raise ForkdError(f"this kernel has no {kib} KiB anonymous mTHP ({self.path})", hint="Linux 6.8+")

    def __enter__(self) -> HostMthp:
        self.saved = self.path.read_text().split("[", 1)[1].split("]", 1)[0]
        self.path.write_text("madvise")
        progress(f"{self.path}: madvise (was {self.saved})")
        return self

    def __exit__(self, *exc) -> None:
        self.path.write_text(self.saved)


def _comm(d: Path) -> str:
    try:
        return (d / "comm").read_text().strip()
    except OSError:
        return ""
