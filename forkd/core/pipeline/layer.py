"""LayerBuild: a chain layer on a snapshot.

Building layer B on A: copy A's flat image (extent by extent, holes kept) to a scratch file, restore A's device
state into a VMM that maps the copy *shared*, run the steps, pause and save the device state, then store only the
pages where the copy now differs from A. The copy is B's flat image: the store keeps it in the content-addressed
cache, so the first spawn of B costs nothing extra.

Disk-backed chains: a layer keeps the overlay its build wrote (backed by its parent's disk, named relatively).
"""

from __future__ import annotations

import base64
import os
import time
from typing import TYPE_CHECKING

from forkd.base.atomic import publish
from forkd.base.steps import Step
from forkd.core.pipeline.job import Job, quiet
from forkd.core.requests import LayerBuild
from forkd.core.warmup import warm_up
from forkd.store import chain
from forkd.store.snapshot import Snapshot
from forkd.store.writer import Diff
from forkd.vmm.driver import RunFiles

if TYPE_CHECKING:
    from forkd.base.cancel import CancelToken
    from forkd.core.runtime import Progress, Runtime


class LayerJob(Job):
    what = "layer build"

    def __init__(self, rt: Runtime, req: LayerBuild, progress: Progress = quiet,
                 cancel: CancelToken | None = None):
        super().__init__(rt, progress, cancel)
        self.req = req

    def prepare(self) -> None:
        self.parent = self.rt.store.ancestors(self.req.parent_tag)[-1]
        self.parent_flat = self.rt.store.materialize(self.req.parent_tag)

    def record(self) -> Snapshot:
        req, parent = self.req, self.parent
        return Snapshot(tag=req.tag, status="writing", created_at=time.time(), memory_mib=parent.memory_mib,
                        vcpus=parent.vcpus, accel=parent.accel, image_id=parent.image_id,
                        kernel_sha256=parent.kernel_sha256, qemu_version=self.rt.driver.version(),
                        warm_imports=req.imports, warm_run=req.run, warm_exec=req.code,
                        parent_tag=req.parent_tag, parent_content_hash=parent.memory_sha256, labels=dict(req.labels))

    def steps(self) -> list[Step]:
        return [("restore", self.restore), ("steps", self.warmup), ("save", self.save), ("diff", self.seal)]

    def restore(self) -> None:
        req, rt = self.req, self.rt
        self.progress(f"copying {req.parent_tag}'s memory image")
        self.memory = self.scratch_memory(f"layer-{req.tag}", self.parent.memory_mib)
        with publish(self.memory, durable=False) as fd:
            chain.copy_extents(self.parent_flat, fd)
        self.progress(f"restoring {req.parent_tag} over the copy")
        self.files = RunFiles(self.workdir("l"))
        vm = self.hold_vm(rt.driver.restore(rt.machine_for(self.parent), self.memory,
                                            rt.store.vmstate_path(req.parent_tag), self.files, share=True))
        vm.agent.call("forked", {"entropy": base64.b64encode(os.urandom(64)).decode(), "child_id": f"layer-{req.tag}",
                                 "hostname": req.tag, "time": time.time()})

    def warmup(self) -> None:
        warm_up(self.vm.agent, self.req.imports, self.req.code, self.req.run, self.progress)

    def save(self) -> None:
        self.progress("pausing and saving device state")
        self.rt.driver.save(self.vm, self.writer.vmstate)
        self.vm = None

    def seal(self) -> None:
        w, store = self.writer, self.rt.store
        if self.parent.has_disk:  # what the steps wrote to disk: the restore's own overlay, kept as the layer's
            self.rt.driver.disks.set_backing(w.take(self.files.disk, w.disk), store.disk_path(self.req.parent_tag))
        self.progress("storing the pages that differ")
        w.seal(memory=Diff(base=self.parent_flat, image=self.memory), vmstate=w.vmstate,
               disk=w.disk if self.parent.has_disk else None)

