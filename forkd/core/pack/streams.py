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
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.h.update(b)
        self.n += len(b)
        return b

    def digest_all(self) -> str:
        """sha256 of the whole file: what was read, then the rest."""
        while self.read(CHUNK):
            pass
        return self.h.hexdigest()


class BytesReader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        b = self.data[self.pos:end]
        self.pos += len(b)
        return b


class Budget:
    """What unpacking a pack may write: bytes stored on disk (zero pages left as holes are free) at most `ratio`
    times the compressed bytes read so far, past the first `floor`: a zstd bomb (zeros and runs compress ~32,000:1)
    is stopped when it has written little more than the bound, not after. `read` is the pack file's reader."""

    def __init__(self, read: HashingReader, ratio: int, floor: int):
        self.read, self.ratio, self.floor, self.stored = read, ratio, floor, 0

    def charge(self, n: int, name: str) -> None:
        self.stored += n
        if self.stored > self.floor and self.stored > self.ratio * self.read.n:
            raise PackError(f"pack member {name!r}: more than {self.ratio} bytes unpacked per compressed byte "
                            f"({self.stored} written from {self.read.n}): a decompression bomb? refused",
                            hint="if you trust this pack, raise FORKD_PACK_MAX_RATIO")


class ZstdStream:
    """Decompressed bytes of a pack for tarfile; notes when the input ran out (a truncated archive). `raw` counts
    and hashes the compressed bytes read."""

    def __init__(self, fh: BinaryIO):
        self.raw = HashingReader(fh)
        self.reader = zstandard.ZstdDecompressor().stream_reader(self.raw, read_across_frames=False)
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
