"""Live branch by pages: mode `live`'s result (a self-contained snapshot; the source runs on) with diff mode's
pause (forkd.core.pipeline.branch_diff).

A child's RAM is its snapshot's flat image plus the pages it wrote since its restore. QEMU's live capture
(`background-snapshot`) write-protects *all* of guest RAM while the source is stopped, so its pause grows with the
RAM (~57 ms p50 at 1.5 GiB here, README "Benchmarks"). Taking only the written pages and the device state while
the source is stopped (VmmDriver.capture_diff) pauses it for a time that grows with those pages (~5 ms at ~800),
and the snapshot is then built after the source runs again: the source's flat image with the pages written over
it, sealed as a base (no `parent_tag`: it depends on no other snapshot's files).

`branch()` (forkd.core.branch) tries this first for a live branch, unless FORKD_BRANCH_LIVE_CAPTURE=write-protect,
and takes QEMU's capture instead (with FORKD_BRANCH_LIVE_CAPTURE=pages: refuses, Conflict) when `prepare` finds
(before anything is written or paused) that:
  * the child has a disk (live mode copies its overlay while the guest's filesystem is frozen, and the
    write-protect capture keeps that instant: forkd.core.pipeline.branch);
  * the host cannot scan a VMM's pages (PAGEMAP_SCAN, Linux 6.7+) or the VMM does not map the image whole;
  * the child wrote more than 1/PAGES_PER_WRITTEN of its RAM since its restore (the pause would pass QEMU's; not
    checked with FORKD_BRANCH_LIVE_CAPTURE=pages);
  * another client holds the child's agent (the pages and device state are one instant only while no host byte
    reaches the guest).
The result says which capture ran (`capture`) and why not pages (`capture_note`).
"""

from __future__ import annotations

from forkd.base.errors import ForkdError
from forkd.base.settings import settings
from forkd.core.pipeline.branch import BranchJob
from forkd.core.pipeline.branch_diff import DiffBranchJob
from forkd.store.snapshot import Snapshot
from forkd.vmm.agent_client import AgentBusy

PAGE = 4096
# Measured here (bench/branch.py): QEMU's write-protect pause ~0.15 us per page of guest RAM (57 ms p50 at 1.5 GiB,
# 16.7 ms at 512 MiB), a pages capture ~2 ms + ~5.5 us per page written (5.6 ms at 768 pages, 10.8 ms at 1,781):
# the two meet near 1/38 of RAM written.
PAGES_PER_WRITTEN = 40


class NotPaged(Exception):  # noqa: N818 - control flow inside branch(), never seen by a caller
    """This live branch takes the VMM's write-protect capture instead; the message says why."""


class PagedBranchJob(DiffBranchJob):
    def check_source(self) -> None:
        if self.machine.disk is not None:
            raise NotPaged("the child has a disk (its overlay is copied while the guest's filesystem is frozen)")
        problem = self.rt.driver.diff_capture_problem(self.source_vm)
        if problem is not None:
            raise NotPaged(problem[0])
        try:
            written = self.rt.driver.written_pages(self.source_vm, self.source_flat)
        except ForkdError as exc:
            raise NotPaged(exc.message) from exc
        except OSError as exc:  # its /proc files: a VMM that exits now is the write-protect capture's to report
            raise NotPaged(f"its written pages could not be counted: {exc}") from exc
        most = (self.source.memory_mib << 20) // PAGE // PAGES_PER_WRITTEN
        if written > most and settings().branch_live_capture != "pages":
            raise NotPaged(f"it wrote {written} pages since its restore, more than 1/{PAGES_PER_WRITTEN} of its RAM "
                           f"({most}): a pause by pages would pass the VMM's")
        self.written = self.timings["written_pages"] = written

    def agent_busy(self, exc: AgentBusy) -> Exception:
        return NotPaged(f"its agent is held by another client ({exc.message})")

    def record(self) -> Snapshot:
        return BranchJob.record(self).with_(qemu_version=self.rt.driver.version())

    def seal(self) -> None:
        w = self.writer
        w.seal(memory=self.image, vmstate=w.vmstate)
