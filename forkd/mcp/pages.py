"""Command output kept for paging: exec_command answers the first page of each stream, read_output the rest.

Bounded: the last `KEEP` outputs (oldest dropped first), each at most what the daemon returned (its own cap)."""

from __future__ import annotations

import secrets
from collections import OrderedDict

KEEP = 32
PAGE = 16 * 1024  # bytes of one page unless the caller asks for another size
MAX_PAGE = 256 * 1024


class Outputs:
    def __init__(self, keep: int = KEEP):
        self.keep, self._kept = keep, OrderedDict()

    def put(self, stdout: bytes, stderr: bytes) -> str:
        oid = "o" + secrets.token_hex(8)
        self._kept[oid] = {"stdout": stdout, "stderr": stderr}
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        return oid

    def get(self, oid: str, stream: str) -> bytes | None:
        kept = self._kept.get(oid)
        return None if kept is None else kept[stream]


def page(data: bytes, offset: int, size: int) -> tuple[str, int | None]:
    """The text of data[offset:offset+size] (never splitting a UTF-8 character) and the next offset, or None at
    the end."""
    end = min(len(data), offset + size)
    while end < len(data) and end > offset and (data[end] & 0xC0) == 0x80:  # a continuation byte: back off
        end -= 1
    return data[offset:end].decode("utf-8", "replace"), (end if end < len(data) else None)
