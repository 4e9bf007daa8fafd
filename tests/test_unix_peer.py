"""forkd.vmm.unix_peer: whether a unix stream connection's server accepted it, asked of the real kernel
(sock_diag) on real sockets; AgentClient.owned builds on it (tests/test_branch_diff.py covers that with a VM)."""

from __future__ import annotations

import socket

import pytest

from forkd.vmm.unix_peer import accepted


@pytest.fixture(autouse=True)
def _sock_diag():
    a, b = socket.socketpair()
    with a, b:
        if accepted(a) is None:
            pytest.skip("this kernel answers no unix sock_diag query (AgentClient.owned then pings)")


def test_a_connection_is_accepted_only_once_the_listener_accepts_it(tmp_path):
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(tmp_path / "s.sock"))
        srv.listen(4)
        first, second = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
        first.connect(str(tmp_path / "s.sock"))
        second.connect(str(tmp_path / "s.sock"))
        assert accepted(first) is False and accepted(second) is False  # both wait in the backlog
        conn, _ = srv.accept()
        assert accepted(first) is True and accepted(second) is False  # one accepted, in order
        conn.close()
        assert accepted(first) is False  # its server end is gone
        first.close()
        second.close()


def test_a_socket_with_no_peer_is_not_known():
    with socket.socket(socket.AF_UNIX) as lone:
        assert accepted(lone) is None
    a, b = socket.socketpair()
    with a, b:
        assert accepted(a) is True
