"""How front ends reach the core: in-process (`LocalBackend`) or through a running daemon over its unix socket
(`RemoteBackend`), with the same methods. `backend()` picks the daemon when one answers, so state has one owner."""

from __future__ import annotations

from forkd.client.backends import Backend, LocalBackend, RemoteBackend, backend

__all__ = ["Backend", "LocalBackend", "RemoteBackend", "backend"]
