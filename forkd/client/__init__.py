"""How front ends reach forkd: one `Backend` protocol, in-process (`LocalBackend`: forkd.core and the reconciler)
or through a running daemon (`RemoteBackend`: the SDK's HTTP client, forkd.client.http/api). `backend()` picks the
daemon when one is configured or answers, so state has one owner."""

from __future__ import annotations

from forkd.client.backends import Backend, LocalBackend, RemoteBackend, backend
from forkd.core.hub import make_server as hub_server  # `forkd hub serve`: a static file server, no daemon
from forkd.core.requests import Branch, Compaction, LayerBuild, ParentBuild, Spawn, parse_egress  # what verbs take
from forkd.reconciler.control import applyset_id, parse_ref, resolve_kind  # naming of declarative objects

__all__ = ["Backend", "Branch", "Compaction", "LayerBuild", "LocalBackend", "ParentBuild", "RemoteBackend", "Spawn",
           "parse_egress",
           "applyset_id", "backend", "hub_server", "parse_ref", "resolve_kind"]
