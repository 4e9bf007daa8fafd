"""A sandbox's files and ports through the service: the guest file streams (forkd.core.files over the child's
agent) and the daemon's port grants with the connection through the child's namespace (forkd.core.ports) or its
agent (forkd.core.relay)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from forkd.base.errors import ForkdError, InvalidInput, NotFound
from forkd.core import files, ports
from forkd.core.files import MAX_CURSOR, PAGE_BYTES, PAGE_ENTRIES  # noqa: F401 - the routes' bounds
from forkd.core.relay import Relay

FILE_NOT_FOUND = {"FileNotFoundError", "IsADirectoryError", "NotADirectoryError"}


class Guest:
    """The file and port verbs of forkd.service.service.Service (`self.rt`: the node's Runtime; `self.grants`:
    the node's port grants, kept in each child's directory; `self.relay`: the streams to ports of children without a
    network device, relayed by their agents)."""

    rt: Any
    grants: ports.PortGrants
    relay: Relay

    # -- files -------------------------------------------------------------------------------------
    def open_files(self, child_id: str, what: str = "") -> AbstractContextManager:
        """The child's file client (forkd.vmm.agent_files.AgentFiles) while the block runs."""
        return files.open_files(self.rt, child_id, what)

    def stream_files(self, child_id: str, what: str, make: Callable[[Any], Iterator[bytes]]) -> Iterator[bytes]:
        return files.stream(self.rt, child_id, what, make)

    def watch(self, child_id: str, path: str, recursive: bool = False, **kw: Any) -> Iterator[dict]:
        return files.watch(self.rt, child_id, path, recursive, **kw)

    def read_file(self, child_id: str, path: str) -> bytes:
        """A whole guest file (upstream's GET /files); a missing one is NotFound, a refused one InvalidInput."""
        with _agent_errors(path), self.rt.agent(child_id) as a:
            return a.read_file(path)

    def write_file(self, child_id: str, path: str, data: bytes, mode: int = 0o644) -> None:
        with _agent_errors(path), self.rt.agent(child_id) as a:
            a.write_file(path, data, mode=mode)

    # -- ports -------------------------------------------------------------------------------------
    def open_port(self, child_id: str, port: int) -> Any:
        """A new grant for `port` of a running child, on any network mode: its token is in this answer only."""
        rec = self.rt.child(child_id)
        ports.reachable(rec)
        return self.grants.grant(rec, port)

    def open_ports(self, child_id: str) -> list:
        """The child's grants, without their tokens."""
        return self.grants.list(self.rt.child(child_id))

    def close_port(self, child_id: str, which: str | int) -> list:
        """Revoke the grant with id `which`, or every grant of the port `which`; the ones revoked."""
        if not (isinstance(which, int) or (which.isascii() and which.isdigit()) or ports.is_grant_id(which)):
            raise InvalidInput(f"{str(which)[:40]!r} is neither a port nor a port grant id",
                               hint="name a port (8000) or a grant id (g + 16 hex digits) from GET "
                                    "/v1/sandboxes/{id}/ports")
        gone = self.grants.revoke(self.rt.child(child_id), which)
        if not gone:
            raise NotFound(f"no port grant {which} of sandbox {child_id}", hint="GET /v1/sandboxes/{id}/ports")
        return gone

    def granted(self, child_id: str, port: int, token: str) -> ports.Target:
        """Where the child's `port` is reached when `token` opens it; NotFound (one answer for every refusal)
        else."""
        try:
            rec = self.rt.child(child_id)
        except ForkdError:
            rec = None
        if rec is not None and rec.status != "running":
            with contextlib.suppress(ForkdError):
                self.grants.drop(rec)  # the child is gone: so are its grants
        if rec is None or rec.status != "running" or not self.grants.check(rec, port, token):
            raise NotFound(f"no open port {port} of sandbox {child_id} for this token",
                           hint="open it with POST /v1/sandboxes/{id}/ports (sb.get_url(port))")
        return ports.reachable(rec)

    def connect(self, target: ports.Target, port: int) -> socket.socket:
        """A TCP connection to the guest's `port`: made inside its namespace, or relayed by its agent."""
        if target.netns is not None:
            return ports.connect(target.netns, port)
        return self.relay.open(target.child_id, port)


class _agent_errors:
    """Guest file errors become NotFound / InvalidInput (404 / 400) instead of a crash (500)."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, et, exc, tb):
        from forkd.vmm.agent_replies import AgentError

        if isinstance(exc, AgentError):
            typ = exc.error.get("type")
            if typ in FILE_NOT_FOUND:
                raise NotFound(f"{self.path}: {exc.error.get('message')}") from exc
            if typ in ("RequestError", "PermissionError"):
                raise InvalidInput(f"{self.path}: {exc.error.get('message')}") from exc
        return False
