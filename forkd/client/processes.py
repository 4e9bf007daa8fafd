"""Processes in a child, in-process (`LocalProcesses`, the service's: forkd.service.processes) and through a
daemon (`RemoteProcesses`, over its streaming API: the light client's, forkd_client.processes), with the wire's
events (`to_line`, `from_line`) they share."""

from __future__ import annotations

from forkd_client.processes import KEEPALIVE, MAX_OUTPUT, Event, RemoteProcesses, from_line, to_line

from forkd.service.processes import LocalProcesses, events

__all__ = ["KEEPALIVE", "MAX_OUTPUT", "Event", "LocalProcesses", "RemoteProcesses", "events", "from_line", "to_line"]
