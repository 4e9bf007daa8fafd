"""One front door: with FORKD_URL + FORKD_TOKEN every CLI verb acts on that daemon (a real `forkd serve` over TCP,
on the fake VMM driver: tests/fake_vmm.py), run from a DIFFERENT FORKD_HOME that stays empty; an unreachable daemon
is a clean Unavailable; the SDK and the CLI raise the same forkd.base.errors types for the same daemon answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.base.errors import Conflict, InvalidInput, NotFound, Unavailable
from forkd.client.http import api_error
from forkd.sdk import Controller, ControllerError
from tests.conftest import BASE_TAG, WARM_GLOBAL
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import free_port, start_api_daemon, stop_api_daemon


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def ok(env: dict[str, str], *args: str) -> str:
    res = cli(env, *args)
    assert res.returncode == 0, f"forkd {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """The CLI's own FORKD_HOME: another machine's, as far as the daemon is concerned."""
    d = tmp_path / "client-home"
    d.mkdir()
    return d


# -- no VMs -------------------------------------------------------------------------------------------------
def test_unreachable_daemon_is_unavailable_without_a_traceback(elsewhere, monkeypatch):
    monkeypatch.setenv("FORKD_RETRY_WAIT", "0.01")  # the same 4 attempts, without the seconds between them
    env = dict(os.environ, FORKD_HOME=str(elsewhere), FORKD_URL=f"http://127.0.0.1:{free_port()}",
               FORKD_TOKEN="t")
    for verb in (["ls"], ["snapshots"], ["exec", "cabc", "--", "true"], ["kill", "--all"], ["gc", "--dry-run"],
                 ["get", "pools"], ["doctor"]):
        res = cli(env, *verb)
        code = 125 if verb[0] == "exec" else Unavailable.exit_code  # exec: forkd's own failures are 125+
        assert res.returncode == code, (verb, res.stderr)
        assert "cannot reach the forkd daemon" in res.stderr and "hint:" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    with pytest.raises(Unavailable) as e:  # the SDK: the same type
        Controller(url=env["FORKD_URL"]).list_sandboxes()
    assert isinstance(e.value, ControllerError) and e.value.status is None and e.value.hint


def test_problem_answers_map_to_the_error_types():
    cases = {400: InvalidInput, 404: NotFound, 409: Conflict, 422: InvalidInput, 503: Unavailable}
    for status, kind in cases.items():
        exc = api_error(status, {"detail": "what", "hint": "how"}, "http://d/x")
        assert type(exc) is kind and exc.status == status and exc.detail == "what" and exc.hint == "how"
        assert exc.exit_code == kind.exit_code


def test_the_sdk_finds_the_daemon_of_forkd_home(elsewhere, monkeypatch):
    """One discovery (forkd.client.http.find_daemon) for SDK and CLI: $FORKD_HOME's socket, not /var/lib/forkd."""
    monkeypatch.delenv("FORKD_URL", raising=False)
    monkeypatch.setenv("FORKD_HOME", str(elsewhere))
    assert Controller().socket is None and Controller().base_url == "http://127.0.0.1:8889"  # upstream's default
    (elsewhere / "forkd.sock").touch()
    assert Controller().socket == str(elsewhere / "forkd.sock")
    res = cli(dict(os.environ), "ls")  # a stale socket file (no daemon answers): the CLI runs in-process
    assert res.returncode == 0, res.stderr
    monkeypatch.setenv("FORKD_URL", "http://node:8889/")
    assert (Controller().socket, Controller().base_url) == (None, "http://node:8889")


# -- a real daemon over TCP ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(home, fake_base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("cliremote"))
    yield d
    stop_api_daemon(d)


def remote_env(daemon, elsewhere: Path) -> dict[str, str]:
    return dict(os.environ, FORKD_HOME=str(elsewhere), FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token)


def test_verbs_act_on_the_daemons_children_and_snapshots(daemon, rt, elsewhere):
    env = remote_env(daemon, elsewhere)
    local = dict(env, FORKD_NO_DAEMON="1")
    ctrl = Controller(url=daemon.url, token=daemon.token)
    [sb] = ctrl.spawn_sandboxes(BASE_TAG, n=1)
    try:
        listed = {c["id"]: c for c in json.loads(ok(env, "ls", "-o", "json"))}
        assert sb.id in listed and listed[sb.id]["status"] == "running"
        assert listed[sb.id]["agent_socket"] is None  # on the daemon's host, not ours
        assert json.loads(ok(local, "ls", "-o", "json")) == []  # this home has no children
        assert BASE_TAG in [s.get("tag") for s in json.loads(ok(env, "snapshots", "-o", "json"))]
        assert json.loads(ok(local, "snapshots", "-o", "json")) == []
        assert json.loads(ok(env, "snapshot-info", BASE_TAG, "-o", "json"))["children"] == [sb.id]
        assert ok(env, "exec", sb.id, "--", "sh", "-c", "cat /root/parent.txt") == "parent\n"
        assert cli(env, "exec", sb.id, "--", "sh", "-c", "exit 7").returncode == 7
        assert ok(env, "eval", sb.id, "WARM_GLOBAL").strip() == repr(WARM_GLOBAL)
        assert "pong" in ok(env, "ping", sb.id)

        # the same daemon answer is the same error type through the CLI (exit code) and the SDK (class)
        res = cli(env, "rmi", BASE_TAG)  # 409: a child of it runs
        assert res.returncode == Conflict.exit_code and sb.id in res.stderr, res.stderr
        with pytest.raises(Conflict):
            ctrl.delete_snapshot(BASE_TAG)
        res = cli(env, "exec", "cnosuchchild", "--", "true")
        assert res.returncode == 125 and "no child" in res.stderr, res.stderr  # exec: never a guest's code
        with pytest.raises(NotFound) as e:
            ctrl.get_sandbox("cnosuchchild")
        assert e.value.status == 404
        res = cli(env, "kill")  # neither ids nor --all: refused by the daemon (400)
        assert res.returncode == InvalidInput.exit_code and "Traceback" not in res.stderr, res.stderr

        assert f"{sb.id}: killed" in ok(env, "kill", sb.id)
        assert sb.id not in [r.id for r in rt.children()]  # gone from the daemon's registry
        assert sb.id not in [c["id"] for c in json.loads(ok(env, "ls", "-o", "json"))]
    finally:
        try:
            ctrl.kill_sandbox(sb.id)
        except NotFound:
            pass
    assert not any((elsewhere / "children").glob("c*"))


def test_fork_goes_to_the_daemon(daemon, rt, elsewhere):
    """`forkd fork` through FORKD_URL: the children are the daemon's (its registry), none in this home."""
    env = remote_env(daemon, elsewhere)
    out = json.loads(ok(env, "fork", "--tag", BASE_TAG, "--count", "2", "-o", "json"))
    ids = [c["id"] for c in out["children"]]
    try:
        assert len(ids) == 2 and set(ids) <= {r.id for r in rt.children() if r.status == "running"}
        assert json.loads(ok(dict(env, FORKD_NO_DAEMON="1"), "ls", "-o", "json")) == []
        assert ok(env, "exec", ids[0], "--", "echo", "remote") == "remote\n"
    finally:
        ok(env, "kill", *ids)
    assert not set(ids) & {r.id for r in rt.children()}


@pytest.mark.parametrize("argv,says", [
    (["--count", "5000"], "--count 5000: must be at most 1000"),
    (["--memory-limit-mib", "3"], "--memory-limit-mib 3: must be at least 64"),
])
def test_a_fork_the_daemon_refuses_names_the_flag_typed(daemon, elsewhere, argv, says):
    """The CLI sends the request as JSON and the daemon checks it (422 naming its fields); the error printed still
    names the flag and value the user typed, as in-process (tests/test_cli_errors.py)."""
    res = cli(remote_env(daemon, elsewhere), "fork", "--tag", BASE_TAG, *argv)
    assert res.returncode == InvalidInput.exit_code, res.stderr
    assert says in res.stderr and f"hint: fix {argv[0]} and run the command again" in res.stderr, res.stderr
    assert not [w for w in ("Spawn", "memory_limit_mib", " n:", "Input should be") if w in res.stderr], res.stderr
