"""A disk-backed VMM's qcow2 chain opened by the driver and handed to QEMU as file descriptors.

A VMM that dropped root and is chrooted into an empty directory cannot open its disk by path, and QEMU 7.2
reopens every image when a migration (save, branch) hands the block devices over. So the driver, as root, opens
each file of the chain once and passes the descriptors in fd sets (`-add-fd`); the block nodes name
`/dev/fdset/N`, which QEMU resolves by duplicating a descriptor of the set with the access mode it asks for (the
top overlay's set holds a read-write and a read-only one, for reopens either way). The chain is spelled out as
`-blockdev` nodes with explicit `backing`, so QEMU follows no name written in a header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from forkd.vmm.disk import chain

CHAIN_MAX = 64  # files below a child's overlay: layers, the snapshot's disk, the image (compaction keeps it short)
TOP = "root"  # the node the virtio-blk device uses


@dataclass
class DiskFds:
    """Descriptors of one VMM's disk chain (bottom first) and the QEMU options that use them."""

    argv: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        """Close the driver's copies (QEMU keeps its own once started)."""
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def _open(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_chain(top: Path, *, throwaway: bool) -> DiskFds:
    """Open `top` (read-write) and every file below it (read-only) and describe them as block nodes. `throwaway`:
    the overlay is a restored child's, so host flushes are skipped (QEMU's cache=unsafe)."""
    files = chain(top)  # top first; qemu-img resolved relative backing names against each file's directory
    if len(files) > CHAIN_MAX + 1:
        raise ValueError(f"{top}: a backing chain of {len(files)} files (at most {CHAIN_MAX + 1})")
    out = DiskFds()
    try:
        below = None
        for n, info in enumerate(reversed(files)):
            is_top = n == len(files) - 1
            fset = n + 1
            modes = (os.O_RDWR, os.O_RDONLY) if is_top else (os.O_RDONLY,)
            for mode in modes:
                fd = _open(info["filename"], mode)
                out.fds.append(fd)
                out.argv += ["-add-fd", f"fd={fd},set={fset}"]
            node = TOP if is_top else f"disk{n}"
            ro = "off" if is_top else "on"
            opts = [f"driver={info['format']}", f"node-name={node}", f"read-only={ro}",
                    f"file.driver=file,file.filename=/dev/fdset/{fset}", "file.aio=threads"]
            if info["format"] == "qcow2":
                if below is None:
                    raise ValueError(f"{info['filename']}: a qcow2 at the bottom of {top}'s chain (it must end in "
                                     "the image's raw root disk)")
                opts.append(f"backing={below}")
            if is_top:
                opts += ["discard=unmap", "file.discard=unmap"]
                opts += ["cache.no-flush=on"] if throwaway else []
            out.argv += ["-blockdev", ",".join(opts)]
            below = node
    except BaseException:
        out.close()
        raise
    return out
