"""The daemon's REST API as the runtime calls it: the light client's `Client` / `AsyncClient` (forkd_client.api:
every call written once, retries, typed errors; results are forkd_client.models), finding the daemon as the
runtime does (forkd.client.http.find_daemon: $FORKD_URL, else $FORKD_HOME's socket, else upstream's default
http://127.0.0.1:8889) and saying, when it cannot be reached, how to run without one.

RemoteBackend (the CLI's door to a daemon) uses `Client`.
"""

from __future__ import annotations

from pathlib import Path

from forkd_client import api

from forkd.client.http import DEFAULT_URL, UNREACHABLE, Endpoint, Retry, find_daemon


def endpoint(url: str | None = None, token: str | None = None, socket: str | Path | None = None) -> Endpoint:
    """The daemon found by find_daemon, else upstream's default http://127.0.0.1:8889."""
    return find_daemon(url, str(socket) if socket else None, token) or Endpoint(DEFAULT_URL, None, token)


class _Runtime:
    """The runtime's discovery and hint, before forkd_client's sender in the MRO."""

    unreachable_hint = UNREACHABLE

    def __init__(self, url: str | None = None, token: str | None = None, socket: str | Path | None = None,
                 timeout: float = 600.0, *, at: Endpoint | None = None, retry: Retry | None = None,
                 base_url: str | None = None):
        super().__init__(timeout=timeout, at=at or endpoint(url or base_url, token, socket), retry=retry)


class Client(_Runtime, api.Client):
    """Synchronous client: `Client()` finds the daemon (see forkd.client.http.find_daemon)."""


class AsyncClient(_Runtime, api.AsyncClient):
    """The same methods as Client, as coroutines."""
