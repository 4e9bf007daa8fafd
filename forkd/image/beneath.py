"""Writing into an image's rootfs without ever leaving it.

An image's rootfs on the host is attacker-shaped: any name in it may be a symlink (absolute, relative, or a chain
through parent symlinks) planted by the image author. Every write forkd makes into it goes through a `Tree`:
a path is resolved from a directory fd of the rootfs the way the guest's kernel would resolve it with the rootfs
as `/` (absolute symlinks and `..` stay inside; openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
RESOLVE_NO_XDEV) when the kernel has it, else a walk one component at a time with O_NOFOLLOW and directory fds),
and the last component is then created, replaced or removed with the *at calls and O_NOFOLLOW, so no component
is ever followed outside the rootfs and the last one is never followed at all.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x01, 0x02, 0x10
IN_ROOT = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
SYS_OPENAT2 = 437  # the same number on every architecture (asm-generic)
MAX_HOPS = 40
SETID = stat.S_ISUID | stat.S_ISGID


class Escape(OSError):
    """A path that cannot be resolved inside the rootfs (too many links, a non-directory in the middle)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2(2) through ctypes; OSError(ENOSYS) when this kernel or libc cannot. EAGAIN (a rename or mount
    somewhere on the host while `..` was resolved) is retried."""
    libc = _libc()
    if libc is None:
        raise OSError(errno.ENOSYS, "no libc")
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    for _ in range(16):
        fd = libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                          ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        e = ctypes.get_errno()
        if e not in (errno.EAGAIN, errno.EINTR):
            break
    raise OSError(e, os.strerror(e), path)


@functools.lru_cache(maxsize=1)
def have_openat2() -> bool:
    top = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        os.close(openat2(top, ".", os.O_PATH, IN_ROOT))
        return True
    except OSError:
        return False
    finally:
        os.close(top)


def split(rel: str) -> list[str]:
    return [p for p in rel.split("/") if p not in ("", ".")]


class Tree:
    """A rootfs directory, held by an fd; every method takes paths relative to it (as the guest sees them)."""

    def __init__(self, root: Path, use_openat2: bool | None = None) -> None:
        self.path = Path(root)
        self.fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.use_openat2 = have_openat2() if use_openat2 is None else use_openat2
        self.setid: dict[str, int] = {}  # path -> the mode (with setuid/setgid) the image asked for

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ resolving
    def _walk(self, parts: list[str], create: bool, any_last: bool = False) -> int:
        """The directory `parts` names (with `any_last`: whatever it names), as an O_PATH fd, resolved inside the
        root one component at a time."""
        stack = [os.dup(self.fd)]
        todo, hops = list(parts), 0
        try:
            while todo:
                comp = todo.pop(0)
                if comp == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                try:
                    fd = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(comp, 0o755, dir_fd=stack[-1])
                    fd = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    os.close(fd)
                    hops += 1
                    if hops > MAX_HOPS:
                        raise Escape(errno.ELOOP, "too many levels of symbolic links", "/".join(parts))
                    target = os.readlink(comp, dir_fd=stack[-1])
                    if target.startswith("/"):
                        for f in stack[1:]:
                            os.close(f)
                        del stack[1:]
                    todo = split(target) + todo
                    continue
                if not stat.S_ISDIR(st.st_mode) and not (any_last and not todo):
                    os.close(fd)
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", "/".join(parts))
                stack.append(fd)
            return stack.pop()
        finally:
            for f in stack:
                os.close(f)

    def dir_fd(self, rel: str, create: bool = False) -> int:
        """An O_PATH fd of the directory `rel` (every symlink on the way followed inside the root); missing
        directories are made (0755) with `create`, else FileNotFoundError."""
        parts = split(rel)
        if not parts:
            return os.dup(self.fd)
        if self.use_openat2:
            try:
                return openat2(self.fd, "/".join(parts), os.O_PATH | os.O_DIRECTORY, IN_ROOT)
            except FileNotFoundError:
                if not create:
                    raise
            except BlockingIOError:  # EAGAIN retried and retried: the walk resolves the same way
                pass
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EXDEV):
                    raise Escape(exc.errno, f"does not resolve inside the rootfs ({exc.strerror})", rel) from None
                raise
        return self._walk(parts, create)

    @contextmanager
    def dir(self, rel: str, create: bool = False) -> Iterator[int]:
        fd = self.dir_fd(rel, create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent(self, rel: str, create: bool = True) -> Iterator[tuple[int, str]]:
        """(fd of the directory holding `rel`, its last component): what the *at calls take."""
        parts = split(rel)
        if not parts or parts[-1] == "..":
            raise Escape(errno.EINVAL, "no last component to write", rel)
        with self.dir("/".join(parts[:-1]), create) as d:
            yield d, parts[-1]

    def open_path(self, rel: str) -> int:
        """An O_PATH fd of whatever `rel` names once every symlink (the last one too) is followed inside the root."""
        parts = split(rel)
        if self.use_openat2 and parts:
            try:
                return openat2(self.fd, "/".join(parts), os.O_PATH, IN_ROOT)
            except BlockingIOError:
                pass
        return self._walk(parts, False, any_last=True)

    def lookup(self, rel: str, follow_last: bool = True) -> os.stat_result | None:
        """stat of `rel` inside the root (None when missing or dangling)."""
        try:
            if follow_last:
                fd = self.open_path(rel)
                try:
                    return os.fstat(fd)
                finally:
                    os.close(fd)
            with self.parent(rel, create=False) as (d, base):
                return os.stat(base, dir_fd=d, follow_symlinks=False)
        except OSError:  # missing, dangling, a loop, a file in the middle
            return None

    def real(self, rel: str) -> str | None:
        """The path of the directory `rel` relative to the root once resolved inside it (for messages and checks)."""
        try:
            with self.dir(rel) as d:
                p = os.readlink(f"/proc/self/fd/{d}")
        except (OSError, Escape):
            return None
        top = os.readlink(f"/proc/self/fd/{self.fd}")
        return os.path.relpath(p, top) if p.startswith(top) else None

    # ------------------------------------------------------------ writing (the last component is never followed)
    @staticmethod
    def remove_at(d: int, base: str) -> None:
        try:
            st = os.stat(base, dir_fd=d, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(base, dir_fd=d)
        else:
            os.unlink(base, dir_fd=d)

    def remove(self, rel: str) -> None:
        try:
            with self.parent(rel, create=False) as (d, base):
                self.remove_at(d, base)
        except (FileNotFoundError, NotADirectoryError):
            pass

    def makedirs(self, rel: str, mode: int | None = None) -> None:
        with self.dir(rel, create=True) as d:
            if mode is not None:
                fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=d)
                try:
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)

    @contextmanager
    def create(self, rel: str, mode: int = 0o644) -> Iterator[int]:
        """A new regular file at `rel` (whatever was there removed first), opened O_EXCL|O_NOFOLLOW for writing."""
        with self.parent(rel) as (d, base):
            self.remove_at(d, base)
            fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
            try:
                yield fd
                os.fchmod(fd, mode & ~SETID)
            finally:
                os.close(fd)

    def write(self, rel: str, data: bytes | str, mode: int = 0o644) -> None:
        with self.create(rel, mode) as fd, os.fdopen(os.dup(fd), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def copy_in(self, rel: str, src: Path, mode: int | None = None) -> None:
        """A host file (forkd's own: agent, busybox, modules) copied to `rel`."""
        with open(src, "rb") as s, self.create(rel, mode if mode is not None else os.fstat(s.fileno()).st_mode) as fd:
            with os.fdopen(os.dup(fd), "wb") as f:
                shutil.copyfileobj(s, f, 1 << 20)

    def symlink(self, rel: str, target: str) -> None:
        with self.parent(rel) as (d, base):
            self.remove_at(d, base)
            os.symlink(target, base, dir_fd=d)
