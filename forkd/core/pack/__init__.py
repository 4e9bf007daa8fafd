"""Packs: a chain of snapshots plus the guest image it needs, as one `tar` stream compressed with zstandard.

Layout of a pack (members in this order):
    forkd-pack.json                          the manifest: format, head tag, chain root->head, image ids, and for
                                             every member its path, size, sha256 and mode
    snapshots/<tag>/{snapshot.json, vmstate, memory.bin | diff.pages + diff.data}   each snapshot, root first
    images/<id>/{vmlinuz, initrd.img, image.json}                                   the guest image(s)

Unpacking trusts nothing in the file: every path is checked against a whitelist shape (no absolute paths, no
`..`, only regular files and directories, only members the manifest lists, none larger than declared), every
file is streamed into a private directory under $FORKD_HOME/tmp and hashed, the snapshot manifests are checked
against each other (parents, content hashes, diff hashes, image), and only then is each snapshot / image
directory moved into place with one rename. Anything that fails removes the private directory: nothing else
was written. Unpacking the same pack twice is a no-op; a tag that exists with other content is a Conflict.

Modules: `rules` (format constants, PackError, path and name rules), `streams` (file objects tarfile reads
from), `manifest` (building and validating forkd-pack.json), `write` (pack), `extract` (streaming a pack into a
private directory), `staged` (cross-checking what was extracted), `read` (unpack, read_manifest).
"""

from forkd.core.pack.read import read_manifest, unpack
from forkd.core.pack.rules import PACK_FORMAT, PACK_MANIFEST, PACK_VERSION, PackError, Progress, safe_relpath
from forkd.core.pack.write import pack

__all__ = ["PACK_FORMAT", "PACK_MANIFEST", "PACK_VERSION", "PackError", "Progress", "pack", "read_manifest",
           "safe_relpath", "unpack"]
