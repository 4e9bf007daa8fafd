"""A guest image from a container image: an OCI image layout, a `docker save` tarball (forkd.image.oci) or a
registry reference pulled pinned to its digest (forkd.image.registry), unpacked with the checks of
forkd.image.oci, given forkd's init, agent, busybox and kernel modules, and cached by content under
$FORKD_HOME/images/<id>: the same content (and options) is built once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from forkd.base.errors import InvalidInput
from forkd.base.paths import Layout
from forkd.image import debs
from forkd.image.build import BUSYBOX_PACKAGE, Image
from forkd.image.oci import OCI_BUILDER_VERSION, Source, open_source, unpack
from forkd.image.registry import RegistryOptions, is_registry_ref, pull, resolve
from forkd.image.rootfs import (
    Progress,
    TooSmall,
    cached_image,
    check_rootfs_kind,
    find_python,
    finish,
    guest_sources_hash,
    inject,
    pip_install,
    workspace,
)


def from_image(layout: Layout, ref: str | Path, memory_mib: int | None = None, pip: tuple[str, ...] = (),
               progress: Progress = lambda s: None, force: bool = False, rootfs: str = "auto",
               registry: RegistryOptions | None = None) -> tuple[Image, bool]:
    """Build (or find in the cache) the guest image for an OCI layout, a docker save tarball or a registry
    reference (docker://..., pulled pinned to its digest: forkd.image.registry). Returns (image, built_now)."""
    layout.ensure()
    if is_registry_ref(ref):
        progress(f"resolving {ref}")
        pinned = resolve(str(ref), registry)

        @contextmanager
        def pulled(work: Path) -> Iterator[Source]:
            progress(f"pulling {pinned.ref.repository}@{pinned.manifest}")
            (work / "pull").mkdir(mode=0o700)
            yield pull(pinned, work / "pull")
        return _build(layout, f"{pinned.manifest}\n{pinned.ref.repository}", pulled, pinned.record(), memory_mib,
                      pip, progress, force, rootfs)
    if registry is not None:
        raise InvalidInput(f"{ref}: registry options (--authfile, --cert-dir, --insecure-registry) apply to "
                           "docker://... references only")
    src = open_source(ref)
    return _build(layout, src.digest, lambda work: nullcontext(src),
                  {"kind": src.kind, "ref": str(Path(ref).absolute()), "digest": src.digest}, memory_mib, pip,
                  progress, force, rootfs)


def _build(layout: Layout, identity: str, opened: Callable[[Path], AbstractContextManager[Source]],
           source: dict, memory_mib: int | None, pip: tuple[str, ...], progress: Progress, force: bool,
           rootfs: str) -> tuple[Image, bool]:
    """The image of the content `identity` names (cached), unpacked from what `opened(scratch dir)` gives."""
    kdeb = debs.kernel_package(layout.debs)
    bdeb = debs.download(layout.debs, BUSYBOX_PACKAGE)
    h = hashlib.sha256(f"forkd-oci-image {OCI_BUILDER_VERSION}\n{identity}\n{kdeb.name}\n{bdeb.name}\n"
                       f"{guest_sources_hash()}\npip={json.dumps(sorted(pip))}\nrootfs={check_rootfs_kind(rootfs)}\n"
                       .encode())
    image_id = "oci-" + h.hexdigest()[:16]
    try:
        hit = None if force else cached_image(layout, image_id, memory_mib)
    except TooSmall:  # built as an initramfs for a larger guest: `auto` now means the disk shape
        if rootfs != "auto":
            raise
        return _build(layout, identity, opened, source, memory_mib, pip, progress, force, "disk")
    if hit is not None:
        return hit, False
    t0 = time.monotonic()
    with workspace(layout, image_id) as (root, out, stage), opened(stage.parent) as src:
        stats = unpack(src, root, progress)
        python = find_python(root)
        progress(f"found Python {python.version[0]}.{python.version[1]} at {python.path}; injecting forkd's "
                 "init, agent, busybox and virtio modules")
        kname = inject(layout, root, python, stage, out / "vmlinuz")
        installed = pip_install(root, python, list(pip), progress)
        meta = {"kind": "oci", "builder_version": OCI_BUILDER_VERSION,
                "source": {**source, "layers": [la.name for la in src.layers]},
                "python": {"path": python.path, "version": f"{python.version[0]}.{python.version[1]}"},
                "pip": {"requested": sorted(pip), "installed": installed},
                "packages": {"kernel": kname, "busybox": bdeb.name},
                "unpack": {"members": stats.members, "whiteouts": stats.whiteouts, "opaque": stats.opaque,
                           "skipped_devices": len(stats.skipped_devices),
                           "setid_stripped": stats.setid_stripped[:100]},
                "build_seconds": round(time.monotonic() - t0, 2)}
        img = finish(layout, image_id, root, out, meta, memory_mib, progress, rootfs)
    return img, True
