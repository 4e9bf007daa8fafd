"""Run a block of this thread inside another network namespace (setns(2) on the calling thread only).

A process started from inside the block is born in that namespace (fork copies the calling thread's namespaces),
with no helper process to exec in between (what `nsenter` costs). A thread that cannot get back to its own
namespace must not go on (it would open sockets in the wrong one): that is fatal by design.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")


def return_to(own: int) -> None:
    """Put this thread back into the namespace of fd `own`, or end the process (see the module's text)."""
    try:
        setns(own)
    except OSError:
        os._exit(70)


@contextlib.contextmanager
def entered(path: str) -> Iterator[int]:
    """The block runs in the network namespace at `path` (e.g. /run/netns/NAME); yields an fd of this thread's own.
    FileNotFoundError when `path` is missing."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(target)
            try:
                yield own
            finally:
                return_to(own)
        finally:
            os.close(target)
    finally:
        os.close(own)
