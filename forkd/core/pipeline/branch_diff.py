"""Diff branch: a running child as a chain layer over its own snapshot (forkd.core.pipeline.branch, mode `diff`).

The child maps its snapshot's flat image `MAP_PRIVATE`, so what it is now is that image plus the pages it wrote,
and its device state. The driver pauses it only while it takes those two (VmmDriver.capture_diff: the pause grows
with the pages the child wrote, not with its RAM), then the branch is sealed like any layer: the pages are applied
to a copy of the snapshot's flat image, the store keeps the ones that differ and adopts the copy as the layer's
flat image (its children then map it at no extra cost). A disk-backed child's overlay is copied while it is paused
and kept as the layer's overlay, backed by its snapshot's disk, as a layer build's is.

So the result depends on its source's snapshot (`parent_tag`, which `forkd snapshot rm` then refuses to delete), as
every layer does; `forkd snapshot compact` writes it as a base when that is unwanted. The other modes write a
self-contained snapshot: live by pages (forkd.core.pipeline.branch_paged: this capture, then flattened) or, where
it cannot, by write-protect, which pauses the source longer as its RAM grows; full for the whole copy.

The capture itself (`ByPages`) is shared by diff and live-by-pages: the branch's Strategy
(forkd.core.pipeline.branch_plan) picks it, with `layer=True` for diff (a chain layer over the source's snapshot)
or False for live (the layer flattened into a self-contained snapshot).

`wait=False` returns once the source runs again (its pause is over: the instant is fixed and its pages are
copied); the layer is sealed in a daemon thread of this process, as for the other modes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.atomic import publish
from forkd.base.steps import Step
from forkd.core.pipeline.branch_disk import copy_disk
from forkd.core.pipeline.branch_errors import DiffUnavailable
from forkd.store import chain
from forkd.store.snapshot import DISK, Snapshot
from forkd.store.writer import Diff
from forkd.vmm.agent_client import AgentClient

if TYPE_CHECKING:
    from forkd.core.pipeline.branch import BranchJob

__all__ = ["ByPages", "DiffUnavailable"]
MIN_SWAPPED_KIB = 64  # a source with less than this in swap is branched as it is
MAX_DEPTH = 32  # layers under a diff branch at most: each one more makes a new head's first flat image dearer


class ByPages:
    """The capture of the pages the source wrote and its device state (VmmDriver.capture_diff), for one job:
    `layer` (diff) seals them as a chain layer over the source's snapshot, else (live by pages) as a base."""

    def __init__(self, layer: bool, written: int | None = None):
        self.layer = layer
        self.written = written  # the source's written pages, when counted before the capture (sizes its buffer)
        self.agent: AgentClient | None = None
        self.source_flat: Path | None = None

    def prepare(self, job: BranchJob) -> None:
        self.source_flat = job.rt.store.materialize(job.source.tag)  # the image the source maps
        if self.layer:
            self.check_source(job)
        if self.written is not None:
            job.timings["written_pages"] = self.written
        # the one host connection to its agent: held, and silent while the source is paused (AgentBusy if another
        # client holds it: branch_errors says what the caller sees)
        self.agent = AgentClient.owned(job.child_files.agent)
        job.stack.callback(self._release_agent)

    @staticmethod
    def check_source(job: BranchJob) -> None:
        """Refuse (before anything is written or paused) a source a diff branch cannot take: a host without the
        page scan, a chain too deep."""
        cid, tag = job.req.child_id, job.source.tag
        problem = job.rt.driver.diff_capture_problem(job.source_vm)
        if problem is not None:
            raise DiffUnavailable(f"child {cid} cannot be branched in diff mode: {problem[0]}", hint=problem[1])
        depth = job.rt.store.depth(tag)
        if depth >= MAX_DEPTH:
            raise DiffUnavailable(f"child {cid} runs from {tag!r}, already {depth} layers deep: a diff "
                                  f"branch would be layer {depth + 1} (at most {MAX_DEPTH})",
                                  hint=f"branch it with --mode live or full (a self-contained snapshot), or compact "
                                       f"{tag!r} ('forkd snapshot compact') and fork from that")

    def record(self, job: BranchJob, snap: Snapshot) -> Snapshot:
        if not self.layer:
            return snap.with_(qemu_version=job.rt.driver.version())
        return snap.with_(parent_tag=job.source.tag, parent_content_hash=job.source.memory_sha256,
                          qemu_version=job.rt.driver.version())

    def steps(self, job: BranchJob) -> list[Step]:
        return [("page_in", lambda: self.page_in_source(job)), ("capture", lambda: self.capture_pages(job))]

    def finish_steps(self, job: BranchJob) -> list[Step]:
        return [("flatten", lambda: self.flatten(job)), ("hash", lambda: self.seal(job))]

    @staticmethod
    def page_in_source(job: BranchJob) -> None:
        """A source with memory in swap (idle page-out) has it read back now, before the pause: the pause reads
        the guest pages it wrote, and one in swap would be read back from zram while the source is stopped."""
        read = job.handle.page_in(min_kib=MIN_SWAPPED_KIB)
        if read:
            job.timings["page_in_kib"] = read

    def capture_pages(self, job: BranchJob) -> None:
        def disk() -> None:  # the VMM flushed its block layer when it stopped: nothing writes the overlay
            copy_disk(job.child_files.disk, job.work / DISK, job.machine.disk, job.timings, job.rt.driver.disks)

        # the driver resumes the source on its own paths; a VMM that broke mid-way is resumed by the hold
        with self.agent.quiet():  # no host byte reaches guest RAM between its device state and its pages
            self.taken = job.rt.driver.capture_diff(
                job.source_vm, self.source_flat, job.writer.vmstate, job.work / chain.PAGES_FILE,
                job.work / chain.DATA_FILE, while_paused=disk if job.machine.disk is not None else None,
                written=self.written)
        job.stack.callback(self.taken.discard)  # its buffer and data file, if the pages are never written
        self._timings(job)
        job.result.pause_ms = self.taken.timings["pause"]
        job.result.qemu_downtime_ms = self.taken.timings.get("pause_qemu")
        self._release_agent()
        job.hold.free()  # the source is free: another branch of it may start

    def _release_agent(self) -> None:
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.close()

    def _timings(self, job: BranchJob) -> None:
        job.timings.update({f"capture_{k}" if k in ("stop", "devices", "write") else k: v
                            for k, v in self.taken.timings.items()})

    def flatten(self, job: BranchJob) -> None:
        """The layer's flat image: a copy of the source's image with the captured pages written over it."""
        self.taken.write()
        self._timings(job)
        self.image = job.scratch_memory(f"branch-{job.req.tag}", job.source.memory_mib)
        with publish(self.image, durable=False) as fd:
            chain.copy_extents(self.source_flat, fd)
            chain.apply_diff(job.work, fd)

    def seal(self, job: BranchJob) -> None:
        w, has_disk = job.writer, job.machine.disk is not None
        if not self.layer:  # live by pages: a base, its own full memory file
            w.seal(memory=self.image, vmstate=w.vmstate)
            return
        if has_disk:  # the source's overlay as it was, still backed by its snapshot's disk (a layer's overlay)
            job.rt.driver.disks.set_backing(w.take(job.work / DISK, w.disk), job.rt.store.disk_path(job.source.tag))
        w.seal(memory=Diff(base=self.source_flat, image=self.image, candidates=job.work), vmstate=w.vmstate,
               disk=w.disk if has_disk else None)
