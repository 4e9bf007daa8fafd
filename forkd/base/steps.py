"""Named, ordered steps with per-step timings (after firecracker-go-sdk's handler lists).

A driver operation (boot, save, restore) and a core request (parent build, layer build, compaction, branch) are
each a list of `(name, fn)` run in order by `run_steps`, which records every step's duration in ms under its
name, so errors, manifests and benchmarks can name them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from forkd.base.errors import ForkdError

Step = tuple[str, Callable[[], object]]


class StepError(ForkdError):
    pass


def run_steps(steps: Sequence[Step], timings: dict[str, float], what: str,
              on_error: Callable[[], str] | None = None, wrap: bool = True,
              check: Callable[[], None] | None = None) -> None:
    """Run `steps` in order, recording each one's duration in ms in `timings`.

    `wrap=True`: a ForkdError or OSError becomes a StepError naming `what` and the step (plus `on_error()`, e.g.
    the VMM's log tail). `wrap=False`: the step's own exception propagates unchanged (callers that match on its
    type, e.g. Conflict), with a note naming the step. `check` runs before each step (a cancel token's check,
    forkd.base.cancel): what it raises propagates unchanged, and the step does not start."""
    for name, fn in steps:
        if check is not None:
            check()
        t0 = time.perf_counter()
        try:
            fn()
        except (ForkdError, OSError) as exc:
            if not wrap:
                exc.add_note(f"{what}: in step '{name}'")
                raise
            extra = on_error() if on_error else ""
            detail = exc.message if isinstance(exc, ForkdError) else str(exc)
            raise StepError(f"{what}: step '{name}' failed: {detail}{extra}",
                            hint=exc.hint if isinstance(exc, ForkdError) else None) from exc
        finally:
            timings[name] = (time.perf_counter() - t0) * 1000.0
