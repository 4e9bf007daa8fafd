"""ParentBuild: boot a parent, warm it up, pause it and write a ready snapshot (or a failed one, never a torn one).

`network="isolated"` gives the parent one virtio-net NIC (guest 10.42.0.2/24, gateway 10.42.0.1): every child of
it (and of layers on it) then runs in its own network namespace. A disk-backed image's parent writes its own
overlay, the snapshot's disk, frozen with it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from forkd.base.errors import ForkdError
from forkd.base.steps import Step
from forkd.core.pipeline.job import Job, quiet
from forkd.core.pipeline.logs import keep_logs
from forkd.core.requests import ParentBuild
from forkd.core.warmup import warm_up
from forkd.store.snapshot import Snapshot
from forkd.vmm.driver import Machine, RunFiles

if TYPE_CHECKING:
    from forkd.base.cancel import CancelToken
    from forkd.core.runtime import Progress, Runtime


class ParentJob(Job):
    what = "parent build"

    def __init__(self, rt: Runtime, req: ParentBuild, progress: Progress = quiet,
                 cancel: CancelToken | None = None):
        super().__init__(rt, progress, cancel)
        self.req = req

    def prepare(self) -> None:
        req, rt = self.req, self.rt
        self.image = rt.image(req.image_id) if req.image_id else rt.build_image(self.progress)[0]
        self.accel = rt.accelerator(self.image, self.progress)[0].accel
        self.machine = Machine(kernel=self.image.kernel, initrd=self.image.initrd, memory_mib=req.memory_mib,
                               vcpus=req.vcpus, accel=self.accel, network=req.network)

    def record(self) -> Snapshot:
        req, image = self.req, self.image
        return Snapshot(tag=req.tag, status="writing", created_at=time.time(), memory_mib=req.memory_mib,
                        vcpus=req.vcpus, accel=self.accel, image_id=image.id, kernel_sha256=image.kernel_sha256,
                        qemu_version=self.rt.driver.version(), warm_imports=req.warm_imports, warm_run=req.warm_run,
                        warm_exec=req.warm_exec, labels=dict(req.labels), network=req.network)

    def steps(self) -> list[Step]:
        return [("boot", self.boot), ("warmup", self.warmup), ("save", self.save), ("memory_copy", self.seal)]

    def boot(self) -> None:
        req, w = self.req, self.writer
        if self.image.disk is not None:  # the parent writes its own overlay, frozen with the snapshot
            self.machine = replace(self.machine, disk=w.disk)
            self.rt.driver.disks.create_overlay(w.disk, self.image.disk)
        self.progress(f"booting the parent ({req.memory_mib} MiB, {req.vcpus} vCPU, {self.accel}"
                      f"{', disk-backed' if self.image.disk else ''})")
        self.memory = self.scratch_memory(req.tag, req.memory_mib)
        work = self.workdir("p")
        try:
            vm = self.rt.driver.boot(self.machine, self.memory, RunFiles(work), timeout=req.boot_timeout)
        except ForkdError as exc:  # the work dir goes on unwind: the error names the logs where they are kept
            raise keep_logs(exc, work, self.rt.layout.logs, f"boot-{req.tag}") from exc
        self.hold_vm(vm)

    def warmup(self) -> None:
        warm_up(self.vm.agent, self.req.warm_imports, self.req.warm_exec, self.req.warm_run, self.progress)

    def save(self) -> None:
        self.progress("pausing and saving device state")
        self.rt.driver.save(self.vm, self.writer.vmstate)
        self.vm = None

    def seal(self) -> None:
        self.progress("writing and hashing the memory file")
        w = self.writer
        if self.machine.disk:  # the boot VMM wrote it: its header must still be the one create_overlay made
            self.rt.driver.disks.check_written(w.disk, self.image.disk)
        w.seal(memory=self.memory, vmstate=w.vmstate, disk=w.disk if self.machine.disk else None)

