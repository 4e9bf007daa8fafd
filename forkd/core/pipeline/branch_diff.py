"""Diff branch: a running child as a chain layer over its own snapshot (forkd.core.pipeline.branch, mode `diff`).

The child maps its snapshot's flat image `MAP_PRIVATE`, so what it is now is that image plus the pages it wrote,
and its device state. The driver pauses it only while it takes those two (VmmDriver.capture_diff: the pause grows
with the pages the child wrote, not with its RAM), then the branch is sealed like any layer: the pages are applied
to a copy of the snapshot's flat image, the store keeps the ones that differ and adopts the copy as the layer's
flat image (its children then map it at no extra cost). A disk-backed child's overlay is copied while it is paused
and kept as the layer's overlay, backed by its snapshot's disk, as a layer build's is.

So the result depends on its source's snapshot (`parent_tag`, which `forkd rmi` then refuses to delete), as every
layer does; `forkd snapshot-compact` writes it as a base when that is unwanted. The other modes write a
self-contained snapshot: live by pages (forkd.core.pipeline.branch_paged: this capture, then flattened) or, where
it cannot, by write-protect, which pauses the source longer as its RAM grows; full for the whole copy.

`wait=False` returns once the source runs again (its pause is over: the instant is fixed and its pages are
copied); the layer is sealed in a daemon thread of this process, as for the other modes.
"""

from __future__ import annotations

from forkd.base.atomic import publish
from forkd.base.errors import Conflict
from forkd.base.steps import Step
from forkd.core.pipeline.branch import BranchJob
from forkd.core.pipeline.branch_disk import copy_disk
from forkd.store import chain
from forkd.store.snapshot import DISK, Snapshot
from forkd.store.writer import Diff
from forkd.vmm.agent_client import AgentBusy, AgentClient

MIN_SWAPPED_KIB = 64  # a source with less than this in swap is branched as it is
MAX_DEPTH = 32  # layers under a diff branch at most: each one more makes a new head's first flat image dearer


class DiffUnavailable(Conflict):
    """A diff branch of this child cannot be made here (checked before anything is written or paused)."""


class DiffBranchJob(BranchJob):
    capture_kind = "pages"
    written: int | None = None  # the source's written pages, when counted before the capture (sizes its buffer)

    def capture_problem(self) -> tuple[str, str] | None:
        return None  # check_source says it, as DiffUnavailable

    def prepare(self) -> None:
        super().prepare()
        self.source_flat = self.rt.store.materialize(self.source.tag)  # the image the source maps
        self.check_source()
        try:  # the one host connection to its agent: held, and silent while the source is paused
            self.agent: AgentClient | None = AgentClient.owned(self.child_files.agent)
            self.stack.callback(self._release_agent)
        except AgentBusy as exc:
            raise self.agent_busy(exc) from exc

    def check_source(self) -> None:
        """Refuse (before anything is written or paused) a source this job cannot take: a host without the page
        scan, a chain too deep."""
        cid = self.req.child_id
        problem = self.rt.driver.diff_capture_problem(self.source_vm)
        if problem is not None:
            raise DiffUnavailable(f"child {cid} cannot be branched in diff mode: {problem[0]}", hint=problem[1])
        depth = self.rt.store.depth(self.source.tag)
        if depth >= MAX_DEPTH:
            raise DiffUnavailable(f"child {cid} runs from {self.source.tag!r}, already {depth} layers deep: a diff "
                                  f"branch would be layer {depth + 1} (at most {MAX_DEPTH})",
                                  hint=f"branch it with --mode live or full (a self-contained snapshot), or compact "
                                       f"{self.source.tag!r} ('forkd snapshot-compact') and fork from that")

    def agent_busy(self, exc: AgentBusy) -> Exception:
        return DiffUnavailable(f"child {self.req.child_id} cannot be branched in diff mode now: {exc.message}",
                               hint="a diff branch needs the child's agent quiet while it is paused; retry once the "
                                    "other client is done, or branch with --mode live")

    def record(self) -> Snapshot:
        return super().record().with_(parent_tag=self.source.tag, parent_content_hash=self.source.memory_sha256,
                                      qemu_version=self.rt.driver.version())

    def steps(self) -> list[Step]:
        return [("stage", self.stage), ("connect", self.connect), ("page_in", self.page_in_source),
                ("capture", self.capture_pages)]

    def page_in_source(self) -> None:
        """A source with memory in swap (idle page-out) has it read back now, before the pause: the pause reads
        the guest pages it wrote, and one in swap would be read back from zram while the source is stopped."""
        read = self.rt.handles.of(self.rec).page_in(min_kib=MIN_SWAPPED_KIB)
        if read:
            self.timings["page_in_kib"] = read

    def finish_steps(self) -> list[Step]:
        return [("flatten", self.flatten), ("hash", self.seal)]

    def capture_pages(self) -> None:
        def disk() -> None:  # the VMM flushed its block layer when it stopped: nothing writes the overlay
            copy_disk(self.child_files.disk, self.work / DISK, self.machine.disk, self.timings, self.rt.driver.disks)

        try:
            with self.agent.quiet():  # no host byte reaches guest RAM between its device state and its pages
                self.taken = self.rt.driver.capture_diff(
                    self.source_vm, self.source_flat, self.writer.vmstate, self.work / chain.PAGES_FILE,
                    self.work / chain.DATA_FILE, while_paused=disk if self.machine.disk is not None else None,
                    written=self.written)
            self.stack.callback(self.taken.discard)  # its buffer and data file, if the pages are never written
        except BaseException as exc:
            self._resume_after(exc)  # the driver resumes on its own paths; this covers a VMM that broke mid-way
            raise
        self._timings()
        self.result.pause_ms = self.taken.timings["pause"]
        self.result.qemu_downtime_ms = self.taken.timings.get("pause_qemu")
        self.rt.driver.release(self.source_vm)  # the source is free: another branch of it may start
        self._release_agent()
        self.child_lock.release()

    def _release_agent(self) -> None:
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.close()

    def _timings(self) -> None:
        self.timings.update({f"capture_{k}" if k in ("stop", "devices", "write") else k: v
                             for k, v in self.taken.timings.items()})

    def flatten(self) -> None:
        """The layer's flat image: a copy of the source's image with the captured pages written over it."""
        self.taken.write()
        self._timings()
        self.image = self.scratch_memory(f"branch-{self.req.tag}", self.source.memory_mib)
        with publish(self.image, durable=False) as fd:
            chain.copy_extents(self.source_flat, fd)
            chain.apply_diff(self.work, fd)

    def seal(self) -> None:
        w, has_disk = self.writer, self.machine.disk is not None
        if has_disk:  # the source's overlay as it was, still backed by its snapshot's disk (a layer's overlay)
            self.rt.driver.disks.set_backing(w.take(self.work / DISK, w.disk), self.rt.store.disk_path(self.source.tag))
        w.seal(memory=Diff(base=self.source_flat, image=self.image, candidates=self.work), vmstate=w.vmstate,
               disk=w.disk if has_disk else None)
