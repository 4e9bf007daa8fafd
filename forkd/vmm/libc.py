"""The C library calls forkd makes through ctypes, declared once: the library handle (errno kept) and the iovec
array that process_madvise and process_vm_readv take."""

from __future__ import annotations

import ctypes
from array import array

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
LIBC.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
LIBC.process_vm_readv.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                  ctypes.c_ulong)
LIBC.process_vm_readv.restype = ctypes.c_ssize_t
UIO_MAXIOV = 1024  # iovecs one call takes at most


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def iovecs(spans: list[tuple[int, int]]) -> ctypes.Array:
    """An iovec array of (address, length) spans (at most UIO_MAXIOV), laid out as flat 64-bit words (a tenth of
    the time of one Iovec object per span: this runs while a diff branch's source is paused)."""
    words = array("Q", [x for span in spans for x in span])
    return (Iovec * len(spans)).from_buffer(words)  # keeps `words` alive
