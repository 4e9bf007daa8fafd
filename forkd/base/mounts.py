"""Mount points beneath a directory, removing a directory tree without ever walking into a mount, and running a
command whose mounts nobody else sees.

Why: a build tool that mounts inside its work tree (mmdebstrap, in root mode, binds the host's /dev, /dev/pts,
/dev/shm, /proc and /sys into the guest root it builds) leaves those mounts behind when it is killed. A plain
recursive delete of that tree (`shutil.rmtree`, `rm -rf`) then walks through the bind mount and deletes the host's
own files: all of /dev/shm, every FORKD_HOME's flat images included (seen on this machine after a killed test
run). So:

    private_mounts(argv) -> argv      run argv in a mount namespace of its own (private propagation): what it
                                      mounts no other process sees, and it all goes when its last process exits,
                                      a kill -9 included
    mounts_beneath(path) -> [Path]    mount points at or beneath `path` in this process's namespace, deepest first
    remove_tree(path) -> [Path]       detach those (MNT_DETACH, deepest first), then delete the tree; if one cannot
                                      be detached (no CAP_SYS_ADMIN), delete nothing and return what is left

`remove_tree` reads the mount table once more just before it deletes: a mount made beneath the tree after that
instant (by a live process working inside a tree being removed, which callers never do) is not seen.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
MNT_DETACH = 2
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes space, tab, newline and backslash as \ooo


def private_mounts(argv: list[str]) -> list[str]:
    """`argv` run in a new mount namespace whose mounts propagate nowhere (util-linux unshare)."""
    return [UNSHARE, "--mount", "--propagation", "private", "--", *argv]


def mounts_beneath(path: Path) -> list[Path]:
    """The mount points at `path` or beneath it (its real path), deepest first."""
    root = os.path.realpath(path)
    prefix = root.rstrip("/") + "/"
    found = set()
    with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            if len(fields) > 4:
                point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
                if point == root or point.startswith(prefix):
                    found.add(point)
    return [Path(p) for p in sorted(found, key=lambda p: (-p.count("/"), p))]


def detach(point: Path) -> None:
    """umount2(point, MNT_DETACH); OSError naming the mount point if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(point), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(point))


def remove_tree(path: Path) -> list[Path]:
    """Delete the directory `path` and everything in it without crossing into a mount: the mounts beneath it are
    detached first. Returns the mount points still there (nothing was deleted then); [] once the tree is gone.
    Only a real directory (not a symbolic link: nothing beneath its target is detached) other than /."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode) or os.path.realpath(path) == "/":
        raise ValueError(f"remove_tree: {path} is not a directory forkd may remove (a link, a file, or /)")
    for point in mounts_beneath(path):
        try:
            detach(point)
        except OSError:
            pass  # reported below: it is still in the table
    left = mounts_beneath(path)
    if left:
        return left
    shutil.rmtree(path, ignore_errors=True)
    return []
