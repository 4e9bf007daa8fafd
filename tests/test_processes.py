"""Processes in a child: start, stream, stdin, PTY, signal, wait, list, kill; the blocking run on top; the
streaming API and the CLI. On the fake VMM driver (tests/fake_vmm.py), which runs the real guest agent: process
handling, framing, the API and the CLI are the same code; a guest's console through `forkd logs` is in
tests/test_daemon_vm.py."""

from __future__ import annotations

import json
import threading

import pytest

from forkd.base.errors import ForkdError
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver


def collect(a, pid: int, gen=None) -> tuple[bytes, bytes, int]:
    """Stdout, stderr and exit code of `pid`, read to its end from `gen` (a stream already begun) or a new one."""
    out, err = bytearray(), bytearray()
    gen = gen if gen is not None else a.stream(pid)
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
        gen, early = a.stream(pid), []
        while not early or early[-1][0] != "stdout":  # stdout and stderr are two pipes: either may come first
            early.append(next(gen))
        # before stdin was sent: streamed, not batched; raw bytes
        assert early[-1] == ("stdout", b"a\xff\n") and early[:-1] in ([], [("stderr", b"err\n")]), early
        a.send_stdin(pid, b"hello\n", eof=True)
        # the same stream read on: a second one would replay whatever chunks the agent had not yet forgotten
        out, err, code = collect(a, pid, gen)
        err = b"".join(d for s, d in early if s == "stderr") + err
        assert code == 7 and out == b"got-hello\n" and err == b"err\n"


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


def test_guest_caps_processes_and_unread_output(rt, fork):
    """The agent holds at most MAX_PROCS processes and PROC_BUFFER unread bytes per process (the writer then
    blocks, as on a full pipe); the host reads at most MAX_READ bytes per reply."""
    from forkd.vmm.agent_replies import MAX_READ

    (c,) = fork(1)
    with rt.agent(c.id) as a:
        flood = a.start(cmd="head -c 8000000 /dev/zero; echo end >&2")
        pids = [a.start(["sleep", "600"]) for _ in range(63)]
        with pytest.raises(ForkdError, match="64 processes are running"):
            a.start(["true"])
        a.kill_process(pids.pop())
        a.wait(pids[0], timeout=0.1)
        entry = next(p for p in a.processes() if p["pid"] == flood)
        assert entry["running"], "the flood blocks once its unread output fills the buffer"
        got, after = 0, 0
        while True:
            out = a.read_output(flood, after, wait=10)
            assert sum(len(d) for _, d in out.chunks) <= MAX_READ
            got += sum(len(d) for s, d in out.chunks if s == "stdout")
            after = out.seq
            if out.done:
                break
        assert got == 8000000 and out.exit_code == 0
        for pid in pids:
            a.kill_process(pid)


# -- through the daemon: API, SDK, CLI ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    from tests.test_api import start_api_daemon, stop_api_daemon

    d = start_api_daemon(home, tmp_path_factory.mktemp("procs"))
    yield d
    stop_api_daemon(d)


@pytest.fixture
def sandbox(daemon):
    from forkd.sdk import Controller, Sandbox
    from tests.conftest import BASE_TAG

    with Sandbox.create(template=BASE_TAG, controller=Controller(url=daemon.url, token=daemon.token)) as sb:
        yield sb


def test_sdk_run_streams_and_background_handles(sandbox):
    from forkd_client import CommandExitException, TimeoutException

    seen: list[str] = []
    with pytest.raises(CommandExitException) as e:  # as E2B's: a non-zero exit raises, the output on it
        sandbox.commands.run("echo one; sleep 0.2; printf 'two\\377'; echo err >&2; exit 3", on_stdout=seen.append)
    res = e.value.result
    assert e.value.exit_code == 3 and e.value.stderr == "err\n" and e.value.stdout == "one\ntwo\ufffd"
    assert res.exit_code == 3 and res.stdout_bytes == b"one\ntwo\xff" and res.stderr == "err\n"
    assert "".join(seen).startswith("one\n")
    assert sandbox.commands.run("echo $FOO; pwd", envs={"FOO": "bar"}, cwd="/tmp").stdout == "bar\n/tmp\n"
    assert sandbox.commands.run("cat", stdin="piped").stdout == "piped"
    lines: list[str] = []
    h = sandbox.commands.run(["/bin/sh", "-c", "while read l; do echo got:$l; done"], background=True, stdin=True,
                             on_stdout=lines.append)
    assert h.pid in [p["pid"] for p in sandbox.commands.list()]
    h.send_stdin("a\n")
    h.send_stdin("b\n", eof=True)
    res = h.wait(60)
    assert res.exit_code == 0 and res.stdout == "got:a\ngot:b\n" and "".join(lines) == res.stdout
    h = sandbox.commands.run("sleep 600", background=True)
    assert h.kill() is True and h.wait(60, check=False).exit_code == -9
    with pytest.raises(TimeoutException) as t:
        sandbox.commands.run("sleep 600", timeout=1)
    assert t.value.result.timed_out is True and t.value.status is None
    assert sandbox.commands.run("sleep 600", timeout=1, check=False).timed_out is True
    assert sandbox.commands.run("exit 4", check=False).exit_code == 4
    big = sandbox.commands.run("head -c 300000 /dev/zero", max_output=1000)
    assert big.truncated is True and len(big.stdout_bytes) == 1000


def test_api_caps_output_with_a_flag_and_documents_the_stream(daemon, sandbox):
    import httpx

    headers = {"Authorization": f"Bearer {daemon.token}"}
    body = {"cmd": "head -c 100000 /dev/zero", "max_output": 10}
    with httpx.stream("POST", f"{daemon.url}/v1/sandboxes/{sandbox.id}/processes", json=body, headers=headers,
                      timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        evs = [json.loads(line) for line in r.iter_lines() if line]
    assert evs[0]["type"] == "start" and evs[-1] == {"type": "exit", "exit_code": 0, "truncated": True,
                                                     "timed_out": False}
    r = httpx.post(f"{daemon.url}/v1/sandboxes/{sandbox.id}/processes", json={"cmd": "true", "nope": 1},
                   headers=headers)
    assert r.status_code == 422 and "nope" in r.text
    spec = httpx.get(f"{daemon.url}/openapi.json", headers=headers).json()
    assert "application/x-ndjson" in spec["paths"]["/v1/sandboxes/{id}/processes"]["post"]["responses"]["200"][
        "content"]


def _cli(daemon, tmp_path, *args: str, input: str | None = None):
    import os
    import subprocess
    import sys

    env = dict(os.environ, FORKD_HOME=str(tmp_path), FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token)
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, env=env,
                          input=input.encode() if input else None, timeout=300)


def test_cli_exec_streams_and_keeps_exit_codes_apart(daemon, sandbox, tmp_path):
    sid = sandbox.id
    res = _cli(daemon, tmp_path, "exec", "-e", "A=1", "-w", "/tmp", sid, "--", "sh", "-c",
               "echo $A $(pwd); printf '\\377' >&2; exit 7")
    assert (res.returncode, res.stdout, res.stderr) == (7, b"1 /tmp\n", b"\xff")
    res = _cli(daemon, tmp_path, "exec", "-i", sid, "--", "sh", "-c", "tr a-z A-Z", input="hello\n")
    assert (res.returncode, res.stdout) == (0, b"HELLO\n")
    res = _cli(daemon, tmp_path, "exec", "-t", sid, "--", "tty")
    assert res.returncode == 0 and res.stdout.startswith(b"/dev/pts/")
    assert _cli(daemon, tmp_path, "exec", sid, "--", "/no/such").returncode == 127
    assert _cli(daemon, tmp_path, "exec", sid, "--", "/etc/passwd").returncode == 126
    assert _cli(daemon, tmp_path, "exec", sid, "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    assert _cli(daemon, tmp_path, "exec", "--timeout", "1", sid, "--", "sleep", "60").returncode == 124
    res = _cli(daemon, tmp_path, "exec", "cnosuchchild", "--", "true")
    assert res.returncode == 125 and b"no child" in res.stderr
    assert _cli(daemon, tmp_path, "exec", "--bogus", sid).returncode == 125


def test_the_light_cli_reads_the_daemons_location_as_settings_does(monkeypatch, tmp_path):
    """forkd/cli/daemon.py reads the variables that locate the daemon without pydantic: the same values."""
    from forkd.cli import daemon as fast

    cases = [{}, {"FORKD_HOME": str(tmp_path)}, {"FORKD_URL": "http://h:1/", "FORKD_TOKEN": "t"},
             {"FORKD_NO_DAEMON": "1"}, {"FORKD_NO_DAEMON": "off", "FORKD_URL": " "},
             {"FORKD_CA": str(tmp_path / "ca.pem"), "FORKD_URL": "https://h"}]
    for env in cases:
        for name in fast.RAW.values():
            monkeypatch.delenv(name, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert fast.light_settings() == fast.full_settings(), env
    monkeypatch.setenv("FORKD_NO_DAEMON", "maybe")
    assert fast.light_settings() is None  # not taken as is: settings() parses (and refuses) it


def test_many_concurrent_streams_on_one_child(rt, fork):
    """Ten callers stream ten commands of one child at once over the one shared connection."""
    from concurrent.futures import ThreadPoolExecutor

    from forkd.client.processes import LocalProcesses

    (c,) = fork(1)
    procs = LocalProcesses(rt)

    def one(i: int) -> bytes:
        return b"".join(ev.get("data", b"") for ev in procs.stream(c.id, cmd=f"echo {i}; sleep 0.5; echo done")
                        if ev["type"] == "stdout")

    with ThreadPoolExecutor(max_workers=10) as pool:
        outs = list(pool.map(one, range(10)))
    assert outs == [f"{i}\ndone\n".encode() for i in range(10)]
