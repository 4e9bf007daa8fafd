"""A test's tmp_path leaves room for a daemon's unix socket beneath a home in it, on pytest-xdist workers too
(tests.basetemp): daemon-starting tests failed there with "AF_UNIX path too long". The socket is bound by the
daemon's own function, under a test name as long as pytest keeps in a directory name. No daemon, no VM."""

from __future__ import annotations

import os

from forkd.api.daemon import bind_unix


def test_a_daemon_socket_binds_beneath_tmp_path_on_any_worker(tmp_path):
    assert len(tmp_path.name) >= 30  # pytest cuts a test's directory name to 30 characters (+ a counter)
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True, mode=0o700)
    sock = bind_unix(home / "forkd.sock", home / "tmp")
    try:
        assert os.path.exists(home / "forkd.sock")
    finally:
        sock.close()
