"""How front ends reach forkd: one `Backend` protocol, in-process (`LocalBackend`: forkd.core and the reconciler)
or through a running daemon (`RemoteBackend`: the SDK's HTTP client, forkd.client.http/api). `backend()` picks the
daemon when one is configured or answers, so state has one owner.

The names below are loaded on first use: a CLI verb that talks to a daemon never imports the in-process runtime,
the reconciler or the spec models (tests/test_cli_imports.py keeps it so)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Backend": "forkd.client.backends", "LocalBackend": "forkd.client.local", "RemoteBackend": "forkd.client.remote",
    "backend": "forkd.client.backends",
    "hub_server": "forkd.core.hub",  # `forkd hub serve`: a static file server, no daemon
    # what the verbs take
    "Branch": "forkd.core.requests", "Compaction": "forkd.core.requests", "LayerBuild": "forkd.core.requests",
    "ParentBuild": "forkd.core.requests", "Spawn": "forkd.core.requests", "parse_egress": "forkd.core.requests",
    # naming of declarative objects
    "applyset_id": "forkd.reconciler.control", "parse_ref": "forkd.spec.refs", "resolve_kind": "forkd.spec.refs",
}
_RENAMED = {"hub_server": "make_server"}

__all__ = ["Backend", "Branch", "Compaction", "LayerBuild", "LocalBackend", "ParentBuild", "RemoteBackend", "Spawn",
           "parse_egress",
           "applyset_id", "backend", "hub_server", "parse_ref", "resolve_kind"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


if TYPE_CHECKING:  # for type checkers and import-linter: the same names, imported eagerly
    from forkd.client.backends import Backend, backend
    from forkd.client.local import LocalBackend
    from forkd.client.remote import RemoteBackend
    from forkd.core.hub import make_server as hub_server
    from forkd.core.requests import Branch, Compaction, LayerBuild, ParentBuild, Spawn, parse_egress
    from forkd.reconciler.control import applyset_id
    from forkd.spec.refs import parse_ref, resolve_kind
