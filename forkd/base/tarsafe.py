"""Extract an untrusted tar stream beneath a directory, never outside it (`forkd cp` from a guest: the guest made
the tar, and the guest is hostile).

* Names are split into components; an absolute name or a `..` component is refused (the whole copy fails, naming
  the member), `.` and empty components are dropped.
* Every directory on the way is opened relative to the one before with O_NOFOLLOW | O_DIRECTORY, so a symlink
  (one in the tar, or one planted earlier) is never followed; files are created with O_CREAT | O_EXCL |
  O_NOFOLLOW after the entry they replace is unlinked (never written through).
* Symlinks are recreated as links (their targets are not followed or checked: they are data); hard links, devices
  and fifos are skipped and counted; set-id and sticky bits are dropped; owners are not applied.
* The bytes written and the members read are bounded (`max_bytes`, `max_members`): a guest cannot fill the disk
  past what the caller allowed.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.errors import InvalidInput

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_MEMBERS = 1_000_000
MAX_LINK = 4096


class ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (a streamed download)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


@dataclass
class Extracted:
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # members not extracted (hard links, devices, fifos)
    top: str | None = None  # the first component of the first member, as the tar named it

    def to_dict(self) -> dict:
        return {"files": self.files, "dirs": self.dirs, "links": self.links, "bytes": self.bytes,
                "skipped": self.skipped[:100], "skipped_count": len(self.skipped)}


def safe_parts(name: str) -> list[str]:
    """The components of a member name, refused (InvalidInput) if it is absolute or climbs with `..`."""
    if "\0" in name:
        raise InvalidInput(f"tar member {name[:200]!r} has a NUL in its name")
    if name.startswith("/"):
        raise InvalidInput(f"tar member {name[:200]!r} has an absolute name: refusing to extract it",
                           hint="the archive came from the guest; it may be crafted to write outside the destination")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"tar member {name[:200]!r} climbs out with '..': refusing to extract it",
                           hint="the archive came from the guest; it may be crafted to write outside the destination")
    return parts


def open_dir(root_fd: int, parts: list[str], create: bool = True) -> int:
    """An fd of root/parts..., each step opened without following a link (created 0700 when missing)."""
    fd = os.dup(root_fd)
    try:
        for p in parts:
            if create:
                try:
                    os.mkdir(p, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(p, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise InvalidInput(f"{'/'.join(parts)}: {p!r} is not a directory (a link or a file?): refusing to "
                                   f"write through it ({exc.strerror})") from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _clear(dfd: int, name: str) -> None:
    """Unlink whatever non-directory entry is at `name` (so a new file or link never writes through one)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"{name!r} exists as a directory: refusing to replace it with a file")
    os.unlink(name, dir_fd=dfd)


class _Extractor:
    def __init__(self, root_fd: int, rename_top: str | None, max_bytes: int, max_members: int):
        self.root_fd, self.rename_top = root_fd, rename_top
        self.max_bytes, self.max_members = max_bytes, max_members
        self.out = Extracted()
        self.dir_modes: list[tuple[list[str], int]] = []

    def parts(self, m: tarfile.TarInfo) -> list[str]:
        parts = safe_parts(m.name)
        if not parts:
            return parts
        if self.out.top is None:
            self.out.top = parts[0]
        if self.rename_top is not None:
            if parts[0] != self.out.top:
                raise InvalidInput(f"tar member {m.name[:200]!r} is not under the archive's top entry "
                                   f"{self.out.top!r}")
            parts[0] = self.rename_top
        return parts

    def member(self, tar: tarfile.TarFile, m: tarfile.TarInfo, n: int) -> None:
        if n >= self.max_members:
            raise InvalidInput(f"the archive has over {self.max_members} members")
        parts = self.parts(m)
        if not parts:
            return
        if m.isdir():
            os.close(open_dir(self.root_fd, parts))
            self.dir_modes.append((parts, m.mode & 0o777))
            self.out.dirs += 1
            return
        if not (m.isreg() or m.issym()):
            self.out.skipped.append("/".join(parts))
            return
        dfd = open_dir(self.root_fd, parts[:-1])
        try:
            _clear(dfd, parts[-1])
            if m.issym():
                self.link(dfd, parts, m)
            else:
                self.file(dfd, parts[-1], tar, m)
        finally:
            os.close(dfd)

    def link(self, dfd: int, parts: list[str], m: tarfile.TarInfo) -> None:
        if not m.linkname or "\0" in m.linkname or len(m.linkname) > MAX_LINK:
            raise InvalidInput(f"tar member {'/'.join(parts)!r} is a link with an invalid target")
        os.symlink(m.linkname, parts[-1], dir_fd=dfd)
        self.out.links += 1

    def file(self, dfd: int, name: str, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        src = tar.extractfile(m)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            while chunk := src.read(1 << 20):
                self.out.bytes += len(chunk)
                if self.out.bytes > self.max_bytes:
                    raise InvalidInput(f"the archive holds over {self.max_bytes} bytes (the limit of this copy)",
                                       hint="raise it with --max-size if you expect that much")
                os.write(fd, chunk)
            os.fchmod(fd, m.mode & 0o777)
            if 0 <= m.mtime < 1 << 40:
                os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)
        self.out.files += 1

    def finish(self) -> None:
        for parts, mode in reversed(self.dir_modes):  # deepest last-made first; a 0500 dir stays writable till now
            fd = open_dir(self.root_fd, parts, create=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)


def extract(chunks: Iterable[bytes], dest: Path, rename_top: str | None = None, max_bytes: int = 1 << 62,
            max_members: int = MAX_MEMBERS) -> Extracted:
    """Extract the tar stream `chunks` beneath the existing directory `dest`. `rename_top`: the first component
    of every member is replaced by this name (and must be the same in every member): `cp ID:/a/dir ./new`."""
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ex = _Extractor(root_fd, rename_top, max_bytes, max_members)
        try:
            with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), 1 << 20), mode="r|") as tar:
                for n, m in enumerate(tar):
                    ex.member(tar, m, n)
        except tarfile.TarError as exc:
            raise InvalidInput(f"the archive is not a valid tar stream: {exc}") from None
        ex.finish()
        return ex.out
    finally:
        os.close(root_fd)
