"""Private directories and files: the one way forkd makes a place other local users cannot read, write or swap.

A private directory is a real directory (never a symbolic link) owned by forkd's effective user with no group or
other permission bits (0700), in a parent nobody else can rename entries of (not writable by others, or sticky
like /dev/shm). `ensure_private_dir` creates one, or accepts an existing one only if it is that already; a
directory forkd's own user made with a looser mode that nobody else could write into (an older forkd's 0755) is
tightened to 0700. Anything else (another owner, group/other-writable, a link, not a directory) is refused with
`UnsafePath`, naming the path and what to do. Files in it are created with `create_private_file` (O_CREAT|O_EXCL|
O_NOFOLLOW: a name that already exists, link or not, is never opened).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from forkd.base.errors import ForkdError

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafePath(ForkdError):
    """A directory or file forkd would trust is not private to it."""


def _refuse(path: Path, why: str) -> UnsafePath:
    return UnsafePath(f"{path} {why}: forkd keeps guest memory and its state there, so it must be a directory "
                      f"forkd made itself (owned by uid {os.geteuid()}, mode 0700, not a symbolic link)",
                      hint=f"if you did not make it on purpose, remove it (rm -rf -- {path}) and run forkd again: "
                           "forkd then creates it itself; otherwise set FORKD_HOME / FORKD_SHM elsewhere")


def _check_parent(path: Path) -> None:
    """Nobody but root and forkd's user may rename or replace entries of the parent: it is theirs and not
    group/other-writable, or it is sticky (like /dev/shm and /tmp)."""
    parent = path.parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise UnsafePath(f"{parent} does not exist", hint=f"create it, or point forkd elsewhere ({path})") from None
    if st.st_mode & stat.S_ISVTX:
        return
    if st.st_mode & 0o022:
        raise UnsafePath(f"{parent} is writable by other users and not sticky: one of them could replace {path}",
                         hint=f"chmod go-w {parent} (or chmod +t), or set FORKD_HOME / FORKD_SHM elsewhere")
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafePath(f"{parent} is owned by uid {st.st_uid}: that user could replace {path}",
                         hint=f"chown {os.geteuid()} {parent}, or set FORKD_HOME / FORKD_SHM elsewhere")


def _verify_fd(fd: int, path: Path, tighten: bool) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory")
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"is owned by uid {st.st_uid}, not forkd's")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise _refuse(path, f"has mode {mode:04o}: other users could have put files in it")
    if mode & 0o077:
        if not tighten:
            raise _refuse(path, f"has mode {mode:04o}: other users can read it")
        os.fchmod(fd, DIR_MODE)  # made by forkd's user with a looser mode (an older forkd): nobody else wrote in it


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse(path, "is a symbolic link") from None
        if isinstance(exc, FileNotFoundError):
            raise
        raise _refuse(path, f"cannot be opened as a directory ({exc.strerror})") from None


def check_private_dir(path: Path, tighten: bool = False) -> Path:
    """`path` if it is a private directory (see the module docstring); UnsafePath if not, FileNotFoundError if it
    does not exist. `tighten`: a directory of forkd's user that only others could read becomes 0700."""
    path = Path(path)
    fd = _open_dir(path)
    try:
        _verify_fd(fd, path, tighten)
    finally:
        os.close(fd)
    return path


def ensure_private_dir(path: Path, tighten: bool = True) -> Path:
    """Create `path` (its parent must exist) with mode 0700, or accept it if it is already private (see
    check_private_dir; `tighten` as there). Never follows a symbolic link; raises UnsafePath naming the path."""
    path = Path(path)
    _check_parent(path)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return check_private_dir(path, tighten)
    except OSError as exc:
        raise UnsafePath(f"cannot create the private directory {path}: {exc.strerror}",
                         hint="FORKD_HOME and FORKD_SHM must name writable directories (FORKD_SHM a tmpfs)") from exc
    fd = _open_dir(path)
    try:
        os.fchmod(fd, DIR_MODE)  # exactly 0700 whatever the umask
        _verify_fd(fd, path, tighten=False)
    finally:
        os.close(fd)
    return path


def make_private_dir(path: Path) -> Path:
    """Create a new private directory at `path` (FileExistsError if anything is there already)."""
    path = Path(path)
    os.mkdir(path, DIR_MODE)
    set_mode(path, DIR_MODE)  # exactly 0700 whatever the umask
    return path


def set_mode(path: Path, mode: int) -> None:
    """chmod `path` without following a symbolic link (OSError ELOOP for one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def create_private_file(path: Path, mode: int = FILE_MODE) -> int:
    """Create `path` exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, `mode`) and return its descriptor (read-write).
    FileExistsError if the name exists (a file, or a link planted there: never followed)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)
    return fd


def check_private_file(path: Path, forbid: int = 0o022) -> os.stat_result | None:
    """`path`'s stat (truthy) if it is a regular file (not a symbolic link, no other hard link) owned by forkd's
    user with none of the `forbid` permission bits (default: nobody else may write it), else None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    ok = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & forbid and st.st_nlink == 1
    return st if ok else None
