"""Disks in packs: hashing sparse members, the backing reference a snapshot's `disk.qcow2` may hold, and
whether the disks of a chain and of its images hold together.

A `disk.qcow2` inside a pack is untrusted: its header names the file QEMU reads beneath it, so a hostile pack
could point it at any host file (`/etc/shadow`, a block device), hand it an external data file, or leave out
the backing format so that QEMU probes the (equally untrusted) `rootfs.ext4` as a qcow2 with its own backing
file. So the header is parsed here, without QEMU, and must name exactly what forkd writes: a base snapshot's
disk `../../images/<image id>/rootfs.ext4` (raw), a layer's `../<parent tag>/disk.qcow2` (qcow2).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from pathlib import Path

from forkd.base.hashing import sha256_file
from forkd.core.pack.rules import IMAGE_DISK, SPARSE_FILES
from forkd.store import chain as chainmod
from forkd.store.snapshot import DISK, Snapshot

_MAGIC = b"QFI\xfb"
_EXT_BACKING_FORMAT = 0xE2792ACA
_EXT_CRYPTO = 0x0537BE77
_EXT_DATA_FILE = 0x44415441
_INCOMPAT_OK = 1 | 1 << 3 | 1 << 4  # dirty, compression type, extended L2 (never: corrupt, external data file)
_AUTOCLEAR_RAW_DATA = 1 << 1


def file_hash(path: Path) -> str:
    """sha256 of a member's content; sparse files extent by extent (holes as zeros): the same digest, faster."""
    return chainmod.hash_image(path) if path.name in SPARSE_FILES else sha256_file(path)


def qcow2_backing(path: Path) -> tuple[str | None, str | None]:
    """(backing file name, backing format) from a qcow2 header, or ValueError for a file that is not a plain
    qcow2 (bad magic or version, encryption, an external data file, unknown incompatible features)."""
    with open(path, "rb") as f:
        head = f.read(104)
        if len(head) < 72 or head[:4] != _MAGIC:
            raise ValueError("not a qcow2 file")
        version, bf_off, bf_size, cluster_bits = struct.unpack_from(">IQII", head, 4)
        (crypt,) = struct.unpack_from(">I", head, 32)
        if version not in (2, 3) or not 9 <= cluster_bits <= 21:
            raise ValueError(f"unsupported qcow2 header (version {version}, cluster bits {cluster_bits})")
        if crypt:
            raise ValueError("an encrypted qcow2")
        incompat = autoclear = 0
        hlen = 72
        if version == 3:
            if len(head) < 104:
                raise ValueError("a truncated qcow2 header")
            incompat, _compat, autoclear, _order, hlen = struct.unpack_from(">QQQII", head, 72)
        if incompat & ~_INCOMPAT_OK or autoclear & _AUTOCLEAR_RAW_DATA:
            raise ValueError(f"qcow2 features forkd never writes (incompatible {incompat:#x}, "
                             f"autoclear {autoclear:#x}: an external data file, or marked corrupt)")
        cluster = 1 << cluster_bits
        f.seek(0)
        first = f.read(cluster)
    end = bf_off or cluster  # where QEMU stops reading header extensions
    if not 72 <= hlen <= end <= len(first):
        raise ValueError("the qcow2 header's extensions or backing name lie outside its first cluster")
    fmt = None
    pos = hlen
    while pos + 8 <= end:
        typ, length = struct.unpack_from(">II", first, pos)
        pos += 8
        if typ == 0:
            break
        if pos + length > end:
            raise ValueError("a qcow2 header extension runs past the header")
        if typ in (_EXT_DATA_FILE, _EXT_CRYPTO):
            raise ValueError("a qcow2 with an external data file or encryption header")
        if typ == _EXT_BACKING_FORMAT:
            fmt = first[pos:pos + length].decode("ascii")
        pos += (length + 7) & ~7
    if not bf_off:
        return None, fmt
    if not 0 < bf_size <= 1023 or bf_off + bf_size > len(first):
        raise ValueError(f"an invalid qcow2 backing file name ({bf_size} bytes at {bf_off})")
    return first[bf_off:bf_off + bf_size].decode("utf-8"), fmt


def expected_backing(s: Snapshot) -> tuple[str, str]:
    """(name, format) the disk of `s` must name as its backing file: relative, so a pack unpacks anywhere."""
    if s.is_layer:
        return f"../{s.parent_tag}/{DISK}", "qcow2"
    return f"../../images/{s.image_id}/{IMAGE_DISK}", "raw"


def disk_problem(snaps: list[Snapshot], metas: Mapping[str, dict], sha: Mapping[str, str],
                 snap_dir: Callable[[str], Path]) -> str | None:
    """Why the disks of `snaps` (root first) and of their images (`metas`: image id -> image.json) do not hold
    together, or None. `sha` maps each member path of the pack to its sha256; `snap_dir` gives a snapshot's
    directory. Every disk listed iff its manifest records one, with that hash; a snapshot has a disk iff its
    image is disk-backed; every snapshot's disk names exactly the backing file forkd writes."""
    for image_id, meta in metas.items():
        listed = f"images/{image_id}/{IMAGE_DISK}" in sha
        if listed != (meta.get("rootfs") == "disk"):
            return (f"image {image_id!r}: " + (f"holds {IMAGE_DISK} but image.json is not disk-backed" if listed
                                               else f"image.json is disk-backed but {IMAGE_DISK} is missing"))
        if listed and sha[f"images/{image_id}/{IMAGE_DISK}"] != meta.get("disk_sha256"):
            return f"image {image_id!r}: {IMAGE_DISK} does not match image.json's disk_sha256"
    for s in snaps:
        arc = f"snapshots/{s.tag}/{DISK}"
        if (arc in sha) != s.has_disk:
            return (f"snapshot {s.tag!r}: " + (f"holds {DISK} but its manifest records no disk (disk_sha256)"
                                               if arc in sha else f"its manifest records a disk but {DISK} is missing"))
        if s.has_disk != (metas[s.image_id].get("rootfs") == "disk"):
            return (f"snapshot {s.tag!r}: " + ("has a disk but" if s.has_disk else "has no disk but")
                    + f" image {s.image_id!r} is " + ("not " if s.has_disk else "") + "disk-backed")
        if not s.has_disk:
            continue
        if sha[arc] != s.disk_sha256:
            return f"snapshot {s.tag!r}: {DISK} does not match its recorded hash (disk_sha256)"
        want = expected_backing(s)
        try:
            got = qcow2_backing(snap_dir(s.tag) / DISK)
        except (OSError, ValueError) as exc:
            return f"snapshot {s.tag!r}: {DISK} is not a usable overlay ({exc})"
        if got != want:
            return (f"snapshot {s.tag!r}: {DISK} must name {want[0]!r} ({want[1]}) as its backing file, not "
                    f"{got[0]!r} ({got[1] or 'no format'})")
    return None
