"""Packs: a chain of snapshots plus the guest image it needs, as one `tar` stream compressed with zstandard.

Layout of a pack (members in this order):
    forkd-pack.json                          the manifest: format, head tag, chain root->head, image ids, and for
                                             every member its path, size, sha256 and mode
    snapshots/<tag>/{snapshot.json, vmstate, memory.bin | diff.pages + diff.data [, disk.qcow2]}
                                             each snapshot, root first; disk.qcow2 when it is disk-backed (its
                                             disk_sha256): a qcow2 overlay naming its backing file relatively,
                                             ../../images/<id>/rootfs.ext4 (the root) or ../<parent>/disk.qcow2
    images/<id>/{vmlinuz, initrd.img, image.json [, rootfs.ext4]}
                                             the guest image(s); rootfs.ext4 when disk-backed (image.json's
                                             disk_sha256)

Unpacking trusts nothing in the file: every path is checked against a whitelist shape (no absolute paths, no
`..`, only regular files and directories, only members the manifest lists, none larger than declared), every
file is streamed into a private directory under $FORKD_HOME/tmp and hashed, the snapshot manifests are checked
against each other (parents, content hashes, diff hashes, disk hashes, image), every snapshot's disk.qcow2 must
name exactly the backing file above (its header is parsed, never trusted: no other file, no external data file),
sparse files (memory.bin, disk.qcow2, rootfs.ext4) are written with holes, and only then is each snapshot / image
directory moved into place with one rename. Anything that fails removes the private directory: nothing else
was written. Unpacking the same pack twice is a no-op; a tag that exists with other content is a Conflict.

Modules: `rules` (format constants, PackError, path and name rules), `streams` (file objects tarfile reads
from), `manifest` (building and validating forkd-pack.json), `disks` (sparse hashes, qcow2 backing references,
disk consistency), `write` (pack), `extract` (streaming a pack into a private directory), `staged`
(cross-checking what was extracted), `read` (unpack, read_manifest).
"""

from forkd.core.pack.read import read_manifest, unpack
from forkd.core.pack.rules import PACK_FORMAT, PACK_MANIFEST, PACK_VERSION, PackError, Progress, safe_relpath
from forkd.core.pack.write import pack

__all__ = ["PACK_FORMAT", "PACK_MANIFEST", "PACK_VERSION", "PackError", "Progress", "pack", "read_manifest",
           "safe_relpath", "unpack"]
