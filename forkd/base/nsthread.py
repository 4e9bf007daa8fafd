"""Start processes in other namespaces by changing one thread's namespaces (setns(2)/unshare(2) act on the calling
thread only).

A process started from such a thread is born in its namespaces (fork copies the calling thread's), with no helper
process to exec in between (what `nsenter` costs) and with its own pid as seen from here. `entered` runs a block
of this thread inside another network namespace; a thread that cannot get back to its own must not go on (it
would open sockets in the wrong one): that is fatal by design. `born_apart` runs a function in a throwaway thread
that also made a mount namespace and a pid namespace for what it starts, which it never needs to leave.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_REC = 0x4000
MS_SLAVE = 0x80000
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


def _call(fn, *args) -> None:
    if fn(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _apart() -> None:
    """This thread gets a mount namespace of its own (a copy of the host's that host mounts and unmounts still
    reach, and that reaches nothing back: slave) and a new pid namespace for the processes it starts."""
    _call(_libc.unshare, CLONE_NEWNS | CLONE_NEWPID)
    _call(_libc.mount, None, b"/", None, MS_REC | MS_SLAVE, None)


def born_apart(fn: Callable[[], T], netns: str | None = None, private: bool = True) -> T:
    """fn() in a fresh thread inside network namespace `netns` (a path, e.g. /run/netns/NAME) when given and, with
    `private`, in a new mount namespace and with a new pid namespace for what it starts (the process fn starts is
    pid 1 there). fn's result, or its exception (OSError from the namespace calls)."""
    out: list = []

    def run() -> None:
        try:
            if netns:
                target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    setns(target)
                finally:
                    os.close(target)
            if private:
                _apart()
            out.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            out.append((False, exc))

    t = threading.Thread(target=run, name="forkd-born-apart", daemon=True)
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value
