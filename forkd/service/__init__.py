"""The one service behind every route and every in-process verb: `Service` (forkd.service.service) owns what a
call means beyond the core (a sandbox's lifetime and labels, the auto-named branch and fork snapshots and their
release), so `forkd fork` in-process and `POST /v1/sandboxes` through the daemon make the same child.

`forkd.api` reaches the runtime only through it (an import-linter contract in pyproject.toml); LocalBackend
(forkd.client.local) is the same service called in-process. `forkd.service.wire` holds the `/v1` wire models;
importing it loads no runtime (only `Service` does, on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Service"]


def __getattr__(name: str) -> Any:
    if name == "Service":
        from forkd.service.service import Service

        return Service
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from forkd.service.service import Service
