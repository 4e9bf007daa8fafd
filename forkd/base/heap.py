"""The daemon's C heap (glibc malloc): a long-lived process whose threads come and go keeps memory they freed in
per-thread arenas, so its RSS follows the most it ever held, not what it holds. `limit_arenas` caps the number of
arenas (as MALLOC_ARENA_MAX does, set before the daemon's threads start); `trim` hands freed memory back to the
kernel (malloc_trim(3): the free pages inside every arena, not only the top of the main heap). Both do nothing
(False) under a C library without them (musl)."""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # mallopt(3) parameter number
DAEMON_ARENAS = 2  # enough for the daemon's few busy threads; each arena costs at least its own mapping


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_arenas(n: int = DAEMON_ARENAS) -> bool:
    """Let malloc create at most `n` arenas from now on (call before starting threads). True if it could."""
    libc = _libc()
    fn = getattr(libc, "mallopt", None) if libc is not None else None
    return bool(fn is not None and fn(M_ARENA_MAX, n) == 1)


def trim() -> bool:
    """Return the memory malloc holds free to the kernel. True if some was returned."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None) if libc is not None else None
    return bool(fn is not None and fn(0) == 1)
