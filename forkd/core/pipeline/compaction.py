"""Compaction: write a chain head as a base snapshot (its flat image + device state, no parent) under a new tag.

Disk-backed chains: the chain's overlays are flattened into one on the image's ext4 (`qemu-img convert -B`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from forkd.base.errors import NotFound
from forkd.base.steps import Step
from forkd.core.pipeline.job import Job, quiet
from forkd.core.requests import Compaction
from forkd.store.snapshot import Snapshot

if TYPE_CHECKING:
    from forkd.base.cancel import CancelToken
    from forkd.core.runtime import Progress, Runtime


class CompactJob(Job):
    what = "compaction"

    def __init__(self, rt: Runtime, req: Compaction, progress: Progress = quiet,
                 cancel: CancelToken | None = None):
        super().__init__(rt, progress, cancel)
        self.req = req

    def prepare(self) -> None:
        self.head = self.rt.store.ancestors(self.req.from_tag)[-1]
        self.flat = self.rt.store.materialize(self.req.from_tag)

    def record(self) -> Snapshot:
        req, head = self.req, self.head
        return head.with_(tag=req.to_tag, status="writing", created_at=time.time(), parent_tag=None,
                          parent_content_hash=None, diff_pages=0, diff_sha256=None, timings_ms={},
                          labels={**head.labels, **req.labels, "forkd.dev/compacted-from": req.from_tag})

    def steps(self) -> list[Step]:
        return [("compact", self.compact)]

    def compact(self) -> None:
        """A source deleted meanwhile (`rmi` does not wait for readers) fails the compaction as NotFound."""
        req, rt, w = self.req, self.rt, self.writer
        self.progress(f"writing {req.from_tag}'s flat image as a base")
        try:
            if self.head.has_disk:  # the chain's overlays as one, on the image's ext4
                rt.driver.disks.flatten(rt.store.disk_path(req.from_tag), w.disk, rt.image(self.head.image_id).disk)
            w.seal(memory=self.flat, memory_sha256=self.head.memory_sha256,
                   vmstate=rt.store.vmstate_path(req.from_tag), disk=w.disk if self.head.has_disk else None)
        except FileNotFoundError as exc:
            try:
                rt.store.get(req.from_tag)
            except NotFound:
                raise NotFound(f"snapshot {req.from_tag!r} was deleted while it was being compacted "
                               f"({exc.filename} went missing)", hint=f"{req.to_tag!r} is not made; compact again "
                               "from a snapshot that exists") from exc
            raise

