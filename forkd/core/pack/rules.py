"""The pack format's constants, its error, and the rules every member path and name must follow."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from forkd.base.errors import ForkdError
from forkd.base.names import TAG_PATTERN
from forkd.store import chain as chainmod
from forkd.store.snapshot import DISK, MANIFEST, MEMORY, VMSTATE

PACK_MANIFEST = "forkd-pack.json"
PACK_FORMAT = "forkd-pack"
PACK_VERSION = 1
MAX_MANIFEST_BYTES = 4 << 20
MAX_MEMBER_BYTES = 1 << 40
BASE_FILES = (MANIFEST, VMSTATE, MEMORY)
LAYER_FILES = (MANIFEST, VMSTATE, chainmod.PAGES_FILE, chainmod.DATA_FILE)
IMAGE_FILES = ("vmlinuz", "initrd.img", "image.json")
IMAGE_DISK = "rootfs.ext4"  # a disk-backed image's root disk (forkd.image.rootfs); its snapshots hold DISK
SPARSE_FILES = (MEMORY, DISK, IMAGE_DISK)  # mostly holes: hashed extent by extent
RATIO_FLOOR = 64 << 20  # bytes written before the compression-ratio bound applies
SOURCE_LABEL = "forkd.dev/source"  # provenance of an unpacked snapshot: "pack:<sha256 of the pack file>"
PULLED_AT_LABEL = "forkd.dev/pulled-at"  # an owned pull's install time (forkd.reconciler.observe reads it)
OWNED_PREFIX = "forkd.dev/"  # labels forkd sets itself (owner, spec hash ...): never taken from a pack
# The reconciler's tags (forkd/reconciler/world.py): "<object name>-<10 hex>" for parents, layers and branches,
# "cmp-<16 hex>" for compactions. A pack may not claim one: the reconciler would adopt it as the snapshot it
# builds for that spec (tests/security/test_pack_publisher.py checks the two stay in step).
RECONCILER_TAG_RE = re.compile(r"^(.+-[0-9a-f]{10}|cmp-[0-9a-f]{16})$")
_NAME_RE = re.compile(TAG_PATTERN)

Progress = Callable[[str], None]


class PackError(ForkdError):
    """A pack that is malformed, unsafe, corrupt or truncated."""

    exit_code = 2


def quiet(_: str) -> None:
    pass


def safe_relpath(path: Any, what: str = "member") -> PurePosixPath:
    """A relative POSIX path without '..', '.', empty or odd components, or refuse (PackError)."""
    if not isinstance(path, str) or not path or len(path) > 512:
        raise PackError(f"pack {what} path {path!r} is not a usable name")
    if "\\" in path or "\0" in path or any(ord(c) < 32 for c in path):
        raise PackError(f"pack {what} path {path!r} contains a backslash or a control character")
    if path.startswith("/"):
        raise PackError(f"pack {what} path {path!r} is absolute: refused")
    parts = path.rstrip("/").split("/")
    if any(p == ".." for p in parts):
        raise PackError(f"pack {what} path {path!r} contains '..': refused (path traversal)")
    if any(p in ("", ".") for p in parts):
        raise PackError(f"pack {what} path {path!r} has an empty or '.' component: refused")
    return PurePosixPath(*parts)


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise PackError(f"pack manifest: invalid {what} {value!r}")
    return value


def check_unowned_tag(tag: str) -> str:
    """`tag` if it is not of the shape the reconciler gives its snapshots, else PackError saying how to share it."""
    if RECONCILER_TAG_RE.match(tag):
        raise PackError(f"pack snapshot tag {tag!r} has the shape of a tag the reconciler owns ('<name>-<10 hex "
                        "digits>' or 'cmp-<16 hex digits>'): a pack may not claim it, or the reconciler would "
                        "adopt the pack's snapshot as the one it builds from a spec",
                        hint="ask the publisher to copy it under another tag and pack that ('forkd snapshot compact "
                             f"--from {tag} --to NAME'), or build it here from the spec")
    return tag


def member_kind(path: PurePosixPath, chain: list[str], images: list[str]) -> tuple[str, str, str]:
    """('snapshots'|'images', tag-or-id, file) for a member path of the allowed shape, else PackError."""
    parts = path.parts
    ok = (len(parts) == 3 and ((parts[0] == "snapshots" and parts[1] in chain
                                and parts[2] in {*BASE_FILES, *LAYER_FILES, DISK})
                               or (parts[0] == "images" and parts[1] in images
                                   and parts[2] in {*IMAGE_FILES, IMAGE_DISK})))
    if not ok:
        raise PackError(f"pack member {str(path)!r} is not one of the files a pack may hold "
                        "(snapshots/<tag>/<snapshot file> of the chain, images/<id>/<image file>)")
    return parts[0], parts[1], parts[2]
