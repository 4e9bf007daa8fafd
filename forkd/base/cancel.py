"""Cooperative cancellation: a token one thread sets and the work of another checks between its steps.

    token = CancelToken()
    with token.on_cancel(lambda: driver.stop(vm)):   # what stops the step in flight (e.g. kills its VMM)
        token.check()                                # between steps: Cancelled once the token is set
        ...

Nothing is raised into the working thread: `cancel()` sets the token and runs the hooks registered now, in the
cancelling thread; the work sees the token at its next `check()`. So a step that blocks in a syscall or a host
tool (copying and hashing a memory file, mmdebstrap, a boot waiting for the guest) finishes first, unless a hook
ends what it waits on (a killed VMM ends a call into its guest).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from forkd.base.errors import Conflict

log = logging.getLogger("forkd.cancel")


class Cancelled(Conflict):
    """The work was cancelled by its caller before it finished (409: it was not done)."""


class CancelToken:
    """Set once, by any thread (`cancel`); read by the work (`cancelled`, `check`)."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._hooks: dict[int, Callable[[], object]] = {}
        self._next = 0
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()

    def cancel(self, reason: str = "cancelled") -> bool:
        """Set the token and run the hooks registered now, here (an error of one is logged, the rest still run).
        False when it was already set (its hooks ran then)."""
        with self._lock:
            if self._set.is_set():
                return False
            self.reason = reason
            self._set.set()
            hooks, self._hooks = list(self._hooks.values()), {}
        for hook in hooks:
            _run(hook)
        return True

    def check(self) -> None:
        """Cancelled (a Conflict) once the token is set; nothing otherwise."""
        if self._set.is_set():
            raise Cancelled(self.reason or "cancelled", hint="submit it again")

    @contextmanager
    def on_cancel(self, hook: Callable[[], object]) -> Iterator[None]:
        """Run `hook` if the token is set while the block runs (at once if it is already set)."""
        with self._lock:
            key, self._next = self._next, self._next + 1
            if not self._set.is_set():
                self._hooks[key] = hook
                hook = None  # type: ignore[assignment]
        if hook is not None:
            _run(hook)
        try:
            yield
        finally:
            with self._lock:
                self._hooks.pop(key, None)


def _run(hook: Callable[[], object]) -> None:
    try:
        hook()
    except Exception as exc:  # noqa: BLE001 - a hook is best effort: the work still sees the token
        log.warning("a cancel hook failed: %s: %s", type(exc).__name__, exc)


def checking(progress: Callable[[str], None], token: CancelToken | None) -> Callable[[str], None]:
    """`progress` that checks `token` before each line: every progress line a build reports (between its stages)
    becomes a point where it stops once cancelled. `progress` itself when there is no token."""
    if token is None:
        return progress

    def report(line: str) -> None:
        token.check()
        progress(line)

    return report
