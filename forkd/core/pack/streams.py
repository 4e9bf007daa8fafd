"""File objects that tarfile reads from: bytes in memory, a file hashed as it is read, a zstandard stream."""

from __future__ import annotations

import hashlib
from typing import BinaryIO

import zstandard

from forkd.core.pack.rules import PackError

CHUNK = 1 << 20


class HashingReader:
    """A file object for tarfile that hashes what it hands out, so a file changed while packing is caught."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.h = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        return b


class BytesReader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        b = self.data[self.pos:end]
        self.pos += len(b)
        return b


class ZstdStream:
    """Decompressed bytes of a pack for tarfile; notes when the input ran out (a truncated archive)."""

    def __init__(self, fh: BinaryIO):
        self.reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=False)
        self.hit_eof = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = CHUNK
        buf = bytearray()
        try:
            while len(buf) < n:
                b = self.reader.read(n - len(buf))
                if not b:
                    self.hit_eof = True
                    break
                buf += b
        except zstandard.ZstdError as exc:
            raise PackError(f"the pack is not valid zstandard data ({exc})") from None
        return bytes(buf)
