"""`forkd exec -i` never passes off a command that got part of its input as a clean run: a stdin send that fails
while the command runs is reported (exit 125 naming the bytes delivered), and a send the daemon refuses because the
process stopped reading is no cut. The failures are real: a daemon address nothing listens on, and a stdin that
closes. No VM: the pump runs in a subprocess whose stdin the test feeds."""

from __future__ import annotations

import socket
import subprocess
import sys

PUMP = """
import sys
from forkd.base.errors import Conflict
from forkd.cli.daemon import Daemon
from forkd.cli.streams import RemoteProcs, StdinPump
procs = RemoteProcs(Daemon(sys.argv[1], None, "t" * 32, None))
pump = StdinPump(procs, "c0123456789", 42)
pump.thread.join(30)
print(repr(pump.cut_short(exited=True)))
gone = StdinPump.__new__(StdinPump)
gone.sent, gone.done, gone.error = 10, False, Conflict("process 42 has no open stdin")
print(repr(gone.cut_short(exited=True)))
"""


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_failed_stdin_send_is_a_cut_and_a_refusal_after_exit_is_not():
    r = subprocess.run([sys.executable, "-c", PUMP, _dead_url()], input=b"input the command never gets\n",
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cut, gone = r.stdout.decode().splitlines()
    assert cut.startswith("'stdin was cut after 0 bytes: cannot reach the forkd daemon"), cut
    assert gone == "None"
