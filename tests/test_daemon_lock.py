"""One daemon per $FORKD_HOME (issue 15, item 4): a second `forkd serve` exits 4 naming the first's pid and leaves
its socket alone; a daemon killed with -9 does not keep the home locked. Real daemon processes, no VMs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.test_api import start_api_daemon, stop_api_daemon


def second_serve(home: Path) -> subprocess.CompletedProcess:
    """`python -m forkd.api serve` on `home`: it must give up at once (60 s: it would otherwise serve forever)."""
    return subprocess.run([sys.executable, "-m", "forkd.api", "serve", "--interval", "1"], capture_output=True,
                          text=True, env=dict(os.environ, FORKD_HOME=str(home)), timeout=60)


def test_a_second_daemon_exits_4_naming_the_first_and_leaves_its_socket(tmp_path):
    home = tmp_path / "h"
    first = start_api_daemon(home, tmp_path)
    try:
        sock = home / "forkd.sock"
        before = sock.stat().st_ino
        res = second_serve(home)
        assert res.returncode == 4, res.stderr
        assert f"pid {first.proc.pid}" in res.stderr and "another forkd daemon" in res.stderr, res.stderr
        assert sock.stat().st_ino == before  # not replaced, not deleted
        assert first.proc.poll() is None
        with first.unix() as c:  # the first one still answers on its socket
            assert c.get("/healthz").status_code == 200
    finally:
        stop_api_daemon(first)
    assert not (home / "forkd.sock").exists()


def test_a_killed_daemon_does_not_keep_the_home_locked(tmp_path):
    home = tmp_path / "h"
    first = start_api_daemon(home, tmp_path)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = start_api_daemon(home, tmp_path)  # the kernel dropped the lock with the process
    try:
        with second.unix() as c:
            assert c.get("/healthz").status_code == 200
        assert (home / "daemon.lock").read_text().strip() == str(second.proc.pid)
    finally:
        stop_api_daemon(second)
