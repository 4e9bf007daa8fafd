"""Core helpers for per-child isolation that need to know about images.

Debian's virtio_net.ko depends on net_failover.ko, which depends on failover.ko; the image builder copies
virtio_net.ko but not those two, so a guest could not load its NIC driver. Rather than change the image (another
part of the tree), a parent built with `network: isolated` boots with the image's initramfs plus a second cpio
archive appended (Linux unpacks concatenated archives in order) holding the two missing modules, taken from the
same kernel package. Children never read an initramfs (they restore), so only parent boots pay for it, once per
image (cached under cache/net-initrd/).
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.paths import Layout
from forkd.image.build import Image

NET_MODULES = ("failover", "net_failover")


def _newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive in the "newc" format the kernel unpacks: (name, mode, data) entries plus the trailer."""
    out = bytearray()
    ino = 0x4F4B0000
    for name, mode, data in [*entries, ("TRAILER!!!", 0, b"")]:
        ino += 1
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08X}" for v in (
            ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        out += hdr.encode() + nb
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def network_initrd(layout: Layout, image: Image) -> Path:
    """The image's initramfs with failover.ko and net_failover.ko appended (built once per image)."""
    out = layout.cache / "net-initrd" / f"{image.id}.img"
    if out.exists():
        return out
    deb = layout.debs / str(image.meta.get("packages", {}).get("kernel", ""))
    if not deb.is_file():
        raise ForkdError(f"the kernel package of image {image.id} is not in {layout.debs}",
                         hint="rebuild the image: forkd image build --force")
    found: dict[str, bytes] = {}
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                base = os.path.basename(member.name)
                if member.isfile() and base.endswith(".ko") and base[:-3] in NET_MODULES:
                    f = tar.extractfile(member)
                    if f is not None:
                        found[base[:-3]] = f.read()
        proc.stdout.close() if proc.stdout else None
    missing = [m for m in NET_MODULES if m not in found]
    if missing:
        raise ForkdError(f"kernel package {deb.name} holds no {', '.join(m + '.ko' for m in missing)}")
    extra = _newc([(f"lib/modules/forkd/{m}.ko", 0o100644, found[m]) for m in NET_MODULES])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    with open(image.initrd, "rb") as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
        dst.write(b"\0" * (-dst.tell() % 512))
        dst.write(extra)
    os.replace(tmp, out)
    return out
