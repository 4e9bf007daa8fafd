"""Pass on a guest's tar stream only as far as it answers the question asked: every member beneath the one
requested top entry.

A guest asked for the tar of `/root/out.txt` must answer with members named `out.txt` (and, for a directory,
`out.txt/...`). Anything else (`.bashrc`, `.ssh/authorized_keys`, a second top entry, an absolute name, a `..`,
a hard link to a name outside the top) fails the stream. Bytes are released only once every header they belong to
was checked: a consumer never receives a byte of a member that was refused, and a refused stream ends with the
error instead of an end-of-archive marker (a tar reader sees a truncated archive, never a complete wrong one).
Symlink targets are data (recreated, never followed, by forkd.base.tarsafe) and pass as they are.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable, Iterator

from forkd.base.errors import InvalidInput

MAX_MEMBERS = 1_000_000
END_OF_ARCHIVE = bytes(2 * tarfile.BLOCKSIZE)
HINT = "the archive came from the guest; it may be crafted to write outside the destination"


def top_name(path: str) -> str:
    """The name a guest's tar of absolute guest `path` must give its single top entry (its last component)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not name or name in (".", ".."):
        raise InvalidInput(f"{path!r} names no single entry to copy (the guest's root or a '..')",
                           hint="copy a directory beneath it, e.g. ID:/root")
    return name


def safe_parts(name: str) -> list[str]:
    """The components of a member name, refused (InvalidInput) if it is absolute or climbs with `..`."""
    if "\0" in name:
        raise InvalidInput(f"tar member {name[:200]!r} has a NUL in its name")
    if name.startswith("/"):
        raise InvalidInput(f"tar member {name[:200]!r} has an absolute name: refusing to extract it", hint=HINT)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"tar member {name[:200]!r} climbs out with '..': refusing to extract it", hint=HINT)
    return parts


def check_member(m: tarfile.TarInfo, top: str) -> list[str]:
    """The member's name components, refused unless they lie beneath `top` (a hard link's target too)."""
    parts = safe_parts(m.name)
    if not parts or parts[0] != top:
        raise InvalidInput(f"tar member {m.name[:200]!r} is not beneath {top!r}, the entry that was asked for: "
                           "refusing the whole copy (nothing was written)", hint=HINT)
    if m.size and not m.isreg():
        raise InvalidInput(f"tar member {m.name[:200]!r} is not a regular file but carries {m.size} bytes of data "
                           "(tar readers disagree on such members): refusing the whole copy", hint=HINT)
    if m.islnk():
        target = safe_parts(m.linkname)
        if not target or target[0] != top:
            raise InvalidInput(f"tar member {m.name[:200]!r} is a hard link to {m.linkname[:200]!r}, outside "
                               f"{top!r}: refusing the whole copy", hint=HINT)
    return parts


class _Tap(io.RawIOBase):
    """A file object over an iterator of chunks that keeps what it returned until it is released."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = b""
        self.held = bytearray()  # bytes returned to the reader and not yet released
        self.released = 0  # stream offset of held[0]

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = bytes(next(self._it))
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self.held += self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def release(self, upto: int) -> bytes:
        """The held bytes before stream offset `upto` (they are forgotten)."""
        n = max(0, min(upto - self.released, len(self.held)))
        out = bytes(self.held[:n])
        del self.held[:n]
        self.released += n
        return out

    def close_source(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def answer_only(chunks: Iterable[bytes], top: str, max_members: int = MAX_MEMBERS) -> Iterator[bytes]:
    """The tar stream `chunks`, passed on only as far as every member lies beneath `top`; then an end marker.

    Raises InvalidInput at the first member that does not (what was passed on before it was checked)."""
    tap = _Tap(chunks)
    try:
        try:
            with tarfile.open(fileobj=tap, mode="r|") as tar:
                n = 0
                for n, m in enumerate(tar, 1):
                    if n > max_members:
                        raise InvalidInput(f"the archive has over {max_members} members")
                    check_member(m, top)
                    tar.members.clear()  # a stream reader keeps every member it read: keep none
                    if chunk := tap.release(tar.offset):
                        yield chunk
                end = tar.offset
        except tarfile.TarError as exc:
            raise InvalidInput(f"the archive is not a valid tar stream: {exc}") from None
        if n == 0:
            raise InvalidInput(f"the archive holds no entry: {top!r} was asked for", hint=HINT)
        if chunk := tap.release(end):
            yield chunk
        yield END_OF_ARCHIVE
    finally:
        tap.close_source()
