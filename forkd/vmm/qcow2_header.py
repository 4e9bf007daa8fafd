"""Checks on a qcow2 header a VMM wrote, before anything running as root opens the file by its header.

A VMM holds its overlay open read-write, so a compromised one can rewrite the header: name another backing file
(the host's `/etc/shadow`, a sibling's overlay), turn on an external data file (a second path QEMU and `qemu-img`
open read-write), drop the backing format so the backing file's bytes are probed for a format, or add encryption
or internal snapshots. forkd's own tools (`qemu-img rebase`, `info --backing-chain`, the next VMM) follow those
fields, so every overlay a VMM wrote is read here first, by this parser, and refused unless it is exactly what
`qemu-img create` made: a backing file named as expected with its format recorded, and no other file.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from forkd.base.errors import ForkdError

MAGIC = b"QFI\xfb"
HEADER_MAX = 64 << 10  # forkd's overlays use 64 KiB clusters: the header and its extensions fit the first one
BACKING_NAME_MAX = 1023  # QEMU's own limit
INCOMPAT_DIRTY = 1 << 0  # set while a VMM with lazy refcounts runs; harmless
INCOMPAT_ALLOWED = INCOMPAT_DIRTY
EXT_END = 0
EXT_BACKING_FORMAT = 0xE2792ACA
EXT_FEATURE_NAMES = 0x6803F857
EXT_BITMAPS = 0x23852875
EXT_ALLOWED = {EXT_BACKING_FORMAT, EXT_FEATURE_NAMES, EXT_BITMAPS}  # not DATA (external data file) nor encryption


class HeaderRefused(ForkdError):
    """A qcow2 file whose header is not one forkd made (see the module docstring)."""


def _refuse(path: Path, why: str) -> HeaderRefused:
    return HeaderRefused(f"{path}: refused disk overlay: {why}",
                         hint="a VMM rewrote the header of its disk (a compromised or buggy VMM); the snapshot is not "
                              "made. Report the child it came from")


def read_header(path: Path) -> dict:
    """The fields of `path`'s qcow2 header that decide what else QEMU opens: backing name and format, features,
    encryption, snapshots, extension types. Reads at most HEADER_MAX bytes; never follows a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _refuse(path, f"cannot open it without following links ({exc.strerror})") from exc
    try:
        head = os.pread(fd, HEADER_MAX, 0)
    finally:
        os.close(fd)
    if len(head) < 72 or head[:4] != MAGIC:
        raise _refuse(path, "not a qcow2 file")
    version, b_off, b_len = struct.unpack_from(">IQI", head, 4)
    crypt, nb_snapshots = struct.unpack_from(">I", head, 32)[0], struct.unpack_from(">I", head, 60)[0]
    if version not in (2, 3):
        raise _refuse(path, f"qcow2 version {version}")
    incompat, header_len = 0, 72
    if version == 3:
        if len(head) < 104:
            raise _refuse(path, "short version 3 header")
        incompat = struct.unpack_from(">Q", head, 72)[0]
        header_len = struct.unpack_from(">I", head, 100)[0]
    if b_len > BACKING_NAME_MAX or b_off + b_len > len(head) or (b_len and b_off < header_len):
        raise _refuse(path, "backing file name out of bounds")
    return {"backing": head[b_off:b_off + b_len].decode("utf-8", "replace") if b_len else None,
            "crypt": crypt, "snapshots": nb_snapshots, "incompatible": incompat,
            **_extensions(path, head, header_len)}


def _extensions(path: Path, head: bytes, at: int) -> dict:
    """Walk the header extensions (type, length, data padded to 8 bytes) up to the end marker."""
    types: list[int] = []
    backing_format = None
    while True:
        if at + 8 > len(head):
            raise _refuse(path, "header extensions run past the first cluster")
        kind, length = struct.unpack_from(">II", head, at)
        if kind == EXT_END:
            return {"extensions": types, "backing_format": backing_format}
        data = head[at + 8:at + 8 + length]
        if len(data) != length:
            raise _refuse(path, "header extension out of bounds")
        types.append(kind)
        if kind == EXT_BACKING_FORMAT:
            backing_format = data.decode("ascii", "replace")
        at += 8 + (length + 7) // 8 * 8


def check_overlay(path: Path, backing: Path, backing_format: str) -> None:
    """Refuse `path` unless its header names `backing` (relative to `path`'s directory or absolute), records
    `backing_format` for it, and makes QEMU open no other file: no external data file, encryption, internal
    snapshots, corrupt flag or unknown incompatible feature."""
    h = read_header(path)
    if h["backing"] is None:
        raise _refuse(path, "it names no backing file")
    named = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), h["backing"]))
    if named != os.path.normpath(os.path.abspath(backing)):
        raise _refuse(path, f"it names {h['backing']!r} as its backing file, not {backing}")
    if h["backing_format"] != backing_format:
        raise _refuse(path, f"its backing format is {h['backing_format']!r}, not {backing_format!r}")
    unknown = [hex(t) for t in h["extensions"] if t not in EXT_ALLOWED]
    problems = [("an encrypted image", h["crypt"] != 0), ("internal snapshots", h["snapshots"] != 0),
                (f"incompatible features {h['incompatible']:#x}", h["incompatible"] & ~INCOMPAT_ALLOWED),
                (f"header extensions {', '.join(unknown)} (e.g. an external data file)", bool(unknown))]
    for what, bad in problems:
        if bad:
            raise _refuse(path, f"it carries {what}")
