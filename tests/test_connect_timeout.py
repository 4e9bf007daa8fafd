"""A connect to a VMM's unix socket never blocks past its timeout (found by the crash harness in CI: an
in-process client waited forever for a child's agent socket while the daemon held QEMU's only connection)."""

from __future__ import annotations

import socket

import pytest

from forkd.base.errors import ForkdError
from forkd.vmm.qmp import connect_unix


def test_a_full_backlog_fails_within_the_timeout(tmp_path):
    path = tmp_path / "one.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(0)  # like a chardev that serves one connection: nobody accepts the next ones
    held = []
    try:
        with pytest.raises(ForkdError, match="within 0.5s"):
            for _ in range(8):  # the backlog fills; the next connect would block forever without a timeout
                held.append(connect_unix(path, 0.5))
        assert held, "the first connections are queued, as QEMU's would be"
    finally:
        for s in held:
            s.close()
        srv.close()


def test_a_socket_that_appears_later_is_still_waited_for(tmp_path):
    path = tmp_path / "late.sock"
    with pytest.raises(ForkdError, match="cannot connect"):
        connect_unix(path, 0.2)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    try:
        s = connect_unix(path, 1.0)
        assert s.gettimeout() is None  # blocking again once connected
        s.close()
    finally:
        srv.close()



@pytest.mark.parametrize("running, error, asked_once", [
    (False, "the VMM exited before it opened", True),  # one miss, one question: no retries against a gone process
    (True, "cannot connect", False),  # asked at every miss, and kept waiting until the timeout
], ids=["exited", "running"])
def test_a_vmm_that_exited_is_not_waited_for(tmp_path, running, error, asked_once):
    """A VMM that exited opens no socket: the connect says so at its first miss instead of waiting its timeout."""
    asked = []

    def alive() -> bool:
        asked.append(True)
        return running

    with pytest.raises(ForkdError, match=error):
        connect_unix(tmp_path / "never.sock", 30.0 if not running else 0.2, alive)
    assert (asked == [True]) if asked_once else len(asked) > 1
