"""Chain layers and compaction.

Building layer B on A: copy A's flat image (extent by extent, holes kept) to a scratch file, restore A's device
state into a QEMU that maps the copy *shared*, run the steps, pause and save the device state, then store only
the pages where the copy now differs from A. The copy is B's flat image: it goes straight into the
content-addressed cache, so the first spawn of B costs nothing extra.

Compaction turns a chain head into a base snapshot (flat memory file + device state, no parent).

Disk-backed chains: a layer keeps the overlay its build wrote (backed by its parent's `disk.qcow2`, named
relatively); compaction flattens the chain's overlays into one on the image's ext4 (`qemu-img convert -B`).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.hashing import sha256_file
from forkd.core.requests import Compaction, LayerBuild
from forkd.core.warmup import warm_up
from forkd.store import chain
from forkd.store.snapshot import MEMORY, VMSTATE, Snapshot
from forkd.vmm.disk import flatten, set_backing
from forkd.vmm.driver import RunFiles

if TYPE_CHECKING:
    from forkd.core.runtime import Progress, Runtime


def _scratch(rt: Runtime, name: str) -> Path:
    shm = Path(os.environ.get("FORKD_SHM", "/dev/shm"))
    base = shm if shm.is_dir() else rt.layout.tmp
    return base / f"forkd-{name}-{os.getpid()}-{secrets.token_hex(3)}.mem"


def build_layer(rt: Runtime, req: LayerBuild, progress: Progress = lambda s: None) -> Snapshot:
    tag, parent_tag, run, imports, code, labels = req.tag, req.parent_tag, req.run, req.imports, req.code, req.labels
    parent = rt.store.ancestors(parent_tag)[-1]
    parent_flat = rt.store.materialize(parent_tag)
    snap = rt.store.begin(Snapshot(
        tag=tag, status="writing", created_at=time.time(), memory_mib=parent.memory_mib, vcpus=parent.vcpus,
        accel=parent.accel, image_id=parent.image_id, kernel_sha256=parent.kernel_sha256,
        qemu_version=rt.driver.version(), warm_imports=tuple(imports), warm_run=tuple(run), warm_exec=tuple(code),
        parent_tag=parent_tag, parent_content_hash=parent.memory_sha256, labels=dict(labels or {})))
    d = rt.store.dir(tag)
    work = rt.layout.tmp / f"l-{os.getpid()}-{secrets.token_hex(2)}"
    scratch = _scratch(rt, f"layer-{tag}")
    vm = None
    timings: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        progress(f"copying {parent_tag}'s memory image")
        fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            chain.copy_extents(parent_flat, fd)
        finally:
            os.close(fd)
        progress(f"restoring {parent_tag} over the copy")
        work.mkdir(parents=True)
        vm = rt.driver.restore(rt.machine_for(parent), scratch, rt.store.vmstate_path(parent_tag), RunFiles(work),
                               share=True)
        vm.agent.call("forked", {"entropy": base64.b64encode(os.urandom(64)).decode(), "child_id": f"layer-{tag}",
                                 "hostname": tag, "time": time.time()})
        timings["restore"] = (time.perf_counter() - t0) * 1000.0
        t1 = time.perf_counter()
        warm_up(vm.agent, tuple(imports), tuple(code), tuple(run), progress)
        timings["steps"] = (time.perf_counter() - t1) * 1000.0
        progress("pausing and saving device state")
        rt.driver.save(vm, d / VMSTATE)
        vm = None
        disk = {}
        if parent.has_disk:  # what the steps wrote to disk: the restore's own overlay, kept as the layer's
            os.rename(RunFiles(work).disk, rt.store.disk_path(tag))
            set_backing(rt.store.disk_path(tag), rt.store.disk_path(parent_tag))
            disk = rt.store.seal_disk(tag)
        t2 = time.perf_counter()
        progress("storing the pages that differ")
        pages, stored = chain.write_diff(parent_flat, scratch, d)
        content = chain.hash_image(scratch)
        timings["diff"] = (time.perf_counter() - t2) * 1000.0
        rt.store.adopt_flat(scratch, content)
        snap = snap.with_(memory_sha256=content, memory_bytes=scratch_size(parent_flat), diff_pages=pages,
                          diff_sha256=chain.diff_hash(d),
                          memory_stored_bytes=stored, vmstate_sha256=sha256_file(d / VMSTATE),
                          vmstate_bytes=(d / VMSTATE).stat().st_size, timings_ms=timings, **disk)
        return rt.store.commit(snap)
    except BaseException as exc:
        if vm is not None:
            rt.driver.stop(vm)
        rt.store.fail(snap, exc)
        raise
    finally:
        scratch.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def scratch_size(path: Path) -> int:
    return path.stat().st_size


def compact(rt: Runtime, req: Compaction, progress: Progress = lambda s: None) -> Snapshot:
    """Write the chain head `from_tag` as a base snapshot `to_tag` (its flat image + device state)."""
    from_tag, to_tag, labels = req.from_tag, req.to_tag, req.labels
    head = rt.store.ancestors(from_tag)[-1]
    flat = rt.store.materialize(from_tag)
    snap = rt.store.begin(head.with_(tag=to_tag, status="writing", created_at=time.time(), parent_tag=None,
                                     parent_content_hash=None, diff_pages=0, timings_ms={},
                                     labels={**head.labels, **(labels or {}), "forkd.dev/compacted-from": from_tag}))
    d = rt.store.dir(to_tag)
    try:
        t0 = time.perf_counter()
        progress(f"writing {from_tag}'s flat image as a base")
        fd = os.open(d / MEMORY, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            chain.copy_extents(flat, fd)
            os.fsync(fd)
            stored = os.fstat(fd).st_blocks * 512
        finally:
            os.close(fd)
        shutil.copyfile(rt.store.vmstate_path(from_tag), d / VMSTATE)
        disk = {}
        if head.has_disk:  # the chain's overlays as one, on the image's ext4
            flatten(rt.store.disk_path(from_tag), rt.store.disk_path(to_tag), rt.image(head.image_id).disk)
            disk = rt.store.seal_disk(to_tag)
        snap = snap.with_(memory_stored_bytes=stored, timings_ms={"compact": (time.perf_counter() - t0) * 1000.0},
                          **disk)
        return rt.store.commit(snap)
    except BaseException as exc:
        rt.store.fail(snap, exc)
        raise
