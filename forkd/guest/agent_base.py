"""What the guest agent's modules share (stdlib only): the request errors, the pids an op still waits for, and
the reaping of orphans (the agent is PID 1). Imported flatly (`from agent_base import ...`): the agent's modules
sit together in the guest's /forkd, which is sys.path[0]; none imports the host package `forkd`."""

import contextlib
import os

LIVE_PIDS = set()


class RequestError(Exception):
    """An error that is the caller's fault (bad arguments); reported, never fatal."""


class CannotRun(RequestError):
    """A process that could not be started: its error reply carries the shell's exit code (126 or 127)."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def reap_orphans():
    """PID 1 adopts orphans; reap those that are not an exec we are still waiting for."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in LIVE_PIDS:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
