"""Processes in a child (issue 16, deliverable 1): start, stream, stdin, PTY, signal, wait, list, kill; the
blocking run on top; the streaming API and the CLI. Real VMs."""

from __future__ import annotations

import json
import threading

import pytest

from forkd.base.errors import ForkdError
from tests.conftest import forkd_cli

pytestmark = pytest.mark.vm


def collect(a, pid: int) -> tuple[bytes, bytes, int]:
    out, err = bytearray(), bytearray()
    gen = a.stream(pid)
    try:
        while True:
            stream, data = next(gen)
            (out if stream == "stdout" else err).extend(data)
    except StopIteration as stop:
        return bytes(out), bytes(err), stop.value


def test_output_streams_as_it_comes_and_is_bytes(rt, fork):
    (c,) = fork(1)
    with rt.agent(c.id) as a:
        pid = a.start(cmd="printf 'a\\377\\n'; echo err >&2; read x; echo got-$x; exit 7", stdin=True)
        first = next(a.stream(pid))
        assert first == ("stdout", b"a\xff\n")  # before stdin was sent: streamed, not batched; raw bytes
        a.send_stdin(pid, b"hello\n", eof=True)
        out, err, code = collect(a, pid)
        assert code == 7 and b"got-hello" in out and err == b"err\n"


def test_background_process_outlives_the_connection(rt, fork):
    (c,) = fork(1)
    with rt.agent(c.id) as a:
        pid = a.start(["/bin/sh", "-c", "echo started; sleep 600"], tag="server", env={"X": "1"}, cwd="/tmp")
    with rt.agent(c.id) as a:  # a new connection: the process is still there, its output kept
        procs = {p["pid"]: p for p in a.processes()}
        assert procs[pid]["running"] and procs[pid]["tag"] == "server"
        assert a.read_output(pid, wait=10).chunks == [("stdout", b"started\n")]
        assert a.wait(pid, timeout=0.5)["running"] is True
        assert a.kill_process(pid) is True
        assert a.wait(pid, timeout=30)["exit_code"] == -9
        assert a.signal(pid, "SIGTERM") is False


def test_pty_size_resize_and_signal(rt, fork):
    (c,) = fork(1)
    with rt.agent(c.id) as a:
        pid = a.start(cmd="stty size; tty; read x; stty size", pty={"rows": 30, "cols": 100}, stdin=True)
        first = b""
        gen = a.stream(pid)
        while b"/dev/pts" not in first:
            first += next(gen)[1]
        assert b"30 100" in first
        a.resize(pid, 50, 120)
        a.send_stdin(pid, b"x\n")
        out, _, code = collect(a, pid)
        assert b"50 120" in out and code == 0
        pid = a.start(["sleep", "600"])
        a.signal(pid, "SIGTERM")
        assert a.wait(pid, timeout=30)["exit_code"] == -15


def test_concurrent_calls_share_one_connection(rt, fork):
    """A stream and another caller of the same child in one process: one connection, replies matched by id."""
    (c,) = fork(1)
    with rt.agent(c.id) as a, rt.agent(c.id) as b:
        assert a is b
        pid = a.start(["cat"], stdin=True)
        results: list = []
        t = threading.Thread(target=lambda: results.append(collect(a, pid)))
        t.start()
        assert b.exec_code("print(6 * 7)")["stdout"] == "42\n"
        b.send_stdin(pid, b"through another caller", eof=True)
        t.join(60)
        assert results == [(b"through another caller", b"", 0)]


def test_start_errors_are_clear(rt, fork):
    (c,) = fork(1)
    with rt.agent(c.id) as a:
        with pytest.raises(ForkdError, match="not found"):
            a.start(["/no/such/binary"])
        with pytest.raises(ForkdError, match="argv"):
            a.start([])
        with pytest.raises(ForkdError, match="no process"):
            a.kill_process(999999)
