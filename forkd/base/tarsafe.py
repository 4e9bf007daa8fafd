"""Extract an untrusted tar stream beneath a directory, never outside it (`forkd cp` from a guest: the guest made
the tar, and the guest is hostile).

* The archive answers one question: every member lies beneath the entry that was asked for
  (forkd.base.taranswer: absolute names, `..` and other top entries fail the whole copy, naming the member).
* It is unpacked into a private staging directory (0700) inside the destination and moved into place only after
  the whole stream was read and checked, so a refused or failed copy writes nothing in the destination. Moving
  into an existing directory merges: a file replaces a file or link of its name (rename, never written through);
  a directory where a file is, or a file where a directory is, fails the copy before anything moves.
* Every directory on the way is opened relative to the one before with O_NOFOLLOW | O_DIRECTORY, so a symlink
  (one in the tar, or one planted earlier) is never followed; files are created with O_CREAT | O_EXCL | O_NOFOLLOW.
* Symlinks are recreated as links (their targets are not followed or checked: they are data); hard links, devices
  and fifos are skipped and counted; set-id and sticky bits are dropped; owners are not applied.
* The bytes written and the members read are bounded (`max_bytes`, `max_members`): a guest cannot fill the disk
  past what the caller allowed.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.errors import InvalidInput
from forkd.base.taranswer import check_member

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

    def to_dict(self) -> dict:
        return {"files": self.files, "dirs": self.dirs, "links": self.links, "bytes": self.bytes,
                "skipped": self.skipped[:100], "skipped_count": len(self.skipped)}


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
    """Writes the members of one archive beneath `root_fd` (the staging directory)."""

    def __init__(self, root_fd: int, top: str, max_bytes: int, max_members: int):
        self.root_fd, self.top = root_fd, top
        self.max_bytes, self.max_members = max_bytes, max_members
        self.out = Extracted()
        self.dir_modes: list[tuple[list[str], int]] = []

    def run(self, chunks: Iterable[bytes]) -> None:
        n = -1
        try:
            with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), 1 << 20), mode="r|") as tar:
                for n, m in enumerate(tar):
                    self.member(tar, m, n)
                    tar.members.clear()  # a stream reader keeps every member it read: keep none
        except tarfile.TarError as exc:
            raise InvalidInput(f"the archive is not a valid tar stream: {exc}") from None
        if n < 0:
            raise InvalidInput(f"the archive holds no entry: {self.top!r} was asked for")

    def member(self, tar: tarfile.TarFile, m: tarfile.TarInfo, n: int) -> None:
        if n >= self.max_members:
            raise InvalidInput(f"the archive has over {self.max_members} members")
        parts = check_member(m, self.top)
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

    def set_dir_modes(self, root_fd: int, name: str, kept: set[tuple[str, ...]]) -> None:
        """Give the directories this copy made (now at `name`/..., not those in `kept`) their archive modes."""
        for parts, mode in reversed(self.dir_modes):  # deepest last-made first; a 0500 dir stays writable till now
            placed = [name, *parts[1:]]
            if tuple(placed) in kept:
                continue
            fd = open_dir(root_fd, placed, create=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)


def _lstat(dfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _place(src_fd: int, name: str, dst_fd: int, dst_name: str, at: tuple[str, ...], move: bool,
           kept: set[tuple[str, ...]]) -> None:
    """Move staged `name` to `dst_name` (merging into a directory there); with move=False only check that it can.

    `kept` collects the destination directories that existed before (merged into, their modes left alone)."""
    src, dst = _lstat(src_fd, name), _lstat(dst_fd, dst_name)
    here = (*at, dst_name)
    if dst is not None and stat.S_ISDIR(src.st_mode) != stat.S_ISDIR(dst.st_mode):
        what = "a directory" if stat.S_ISDIR(dst.st_mode) else "a file"
        raise InvalidInput(f"{'/'.join(here)!r} exists as {what} here and the copy has the other kind: refusing "
                           "the whole copy (nothing was written)", hint="move it away or copy to another name")
    if dst is None or not stat.S_ISDIR(dst.st_mode):
        if move:
            os.rename(name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    kept.add(here)
    sfd, dfd = os.open(name, DIR_FLAGS, dir_fd=src_fd), os.open(dst_name, DIR_FLAGS, dir_fd=dst_fd)
    try:
        for entry in sorted(os.listdir(sfd)):
            _place(sfd, entry, dfd, entry, here, move, kept)
    finally:
        os.close(sfd)
        os.close(dfd)


def extract(chunks: Iterable[bytes], dest: Path, top: str, name: str | None = None, max_bytes: int = 1 << 62,
            max_members: int = MAX_MEMBERS) -> Extracted:
    """Extract the guest's tar of the entry `top` beneath the existing directory `dest`, as `name` (default: `top`).

    Nothing appears in `dest` unless the whole archive was read, checked and unpacked (see the module's text)."""
    name = name or top
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stage = f".forkd-cp-{secrets.token_hex(8)}"
    try:
        os.mkdir(stage, 0o700, dir_fd=root_fd)
        try:
            stage_fd = os.open(stage, DIR_FLAGS, dir_fd=root_fd)
            try:
                ex = _Extractor(stage_fd, top, max_bytes, max_members)
                ex.run(chunks)
                kept: set[tuple[str, ...]] = set()
                _place(stage_fd, top, root_fd, name, (), False, kept)
                _place(stage_fd, top, root_fd, name, (), True, set())
                ex.set_dir_modes(root_fd, name, kept)
                return ex.out
            finally:
                os.close(stage_fd)
        finally:
            shutil.rmtree(stage, dir_fd=root_fd, ignore_errors=True)
    finally:
        os.close(root_fd)
