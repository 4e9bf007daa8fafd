"""One CLI grammar (issue 17, deliverable 10): the same flag means the same thing in every command, durations
have one format, `--version`, shell completion, and the old spellings still work (with a warning). No VMs: each
command here fails fast (nothing to fork, claim or delete in an empty home) after its flags were parsed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from forkd.base.durations import parse_duration
from forkd.cli import streams
from forkd.cli.main import app
from forkd.cli.options import complete_children, complete_pools, complete_snapshots
from forkd.cli.tree import command_tree


def _forkd(home, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FORKD_HOME=str(home), FORKD_NO_DAEMON="1")
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("1.5", 1.5), ("500ms", 0.5), ("90s", 90), ("5m", 300),
                                               ("1h30m", 5400), ("2d", 172800)])
def test_one_duration_format(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 m", "5x", "-1", "m", "1m-2s"])
def test_bad_durations_name_the_format(text):
    with pytest.raises(ValueError, match="90s, 5m"):
        parse_duration(text)


def test_version_flag(tmp_path):
    res = _forkd(tmp_path, "--version")
    assert res.returncode == 0 and res.stdout.startswith("forkd "), res


def test_a_bad_duration_exits_2_before_anything_runs(tmp_path):
    res = _forkd(tmp_path, "fork", "--tag", "nosuch", "--timeout", "5x")
    assert res.returncode == 2 and "not a duration" in res.stderr, res


def test_count_and_its_old_spelling(tmp_path):
    new = _forkd(tmp_path, "claim", "nosuch", "--count", "2")
    old = _forkd(tmp_path, "claim", "nosuch", "-n", "2")
    assert new.returncode == old.returncode == 3, (new, old)  # parsed, then: no such pool
    assert "old spelling" not in new.stderr
    assert "`-n N` is the old spelling of `--count N`" in old.stderr.replace("\n", " "), old.stderr


def test_rm_force_short_flag_is_an_old_spelling(tmp_path):
    res = _forkd(tmp_path, "snapshot", "rm", "-f", "nosuch")
    assert res.returncode == 3 and "--force" in res.stderr, res
    assert "-f" not in _forkd(tmp_path, "snapshot", "rm", "--help").stdout.split("--force")[0].split("Options")[-1]


@pytest.mark.parametrize(("old", "new"), [(["snapshots"], ["snapshot", "ls"]),
                                          (["snapshot-info", "nosuch"], ["snapshot", "info", "nosuch"]),
                                          (["rmi", "nosuch"], ["snapshot", "rm", "nosuch"])])
def test_the_old_snapshot_verbs_run_the_new_ones_with_a_warning(tmp_path, old, new):
    was, now = _forkd(tmp_path, *old), _forkd(tmp_path, *new)
    assert (was.returncode, was.stdout) == (now.returncode, now.stdout), (was, now)
    assert f"`forkd {old[0]}` is the old spelling of `forkd {' '.join(new[:2])}`" in was.stderr.replace("\n", " ")
    assert "old spelling" not in now.stderr, now


def test_output_is_a_format_everywhere_and_old_paths_still_work(tmp_path):
    out = tmp_path / "crds"
    res = _forkd(tmp_path, "crds", "-o", str(out))  # the old spelling: a directory
    assert res.returncode == 0 and "--output-dir" in res.stderr, res
    assert sorted(p.name for p in out.iterdir())
    assert _forkd(tmp_path, "crds", "-o", "json").returncode == 2  # a format it does not print
    res = _forkd(tmp_path, "schema", "--output-dir", str(tmp_path / "s"))
    assert res.returncode == 0 and (tmp_path / "s" / "forkd.json").is_file(), res
    res = _forkd(tmp_path, "pack", "--tag", "nosuch")
    assert res.returncode == 2 and "--output-file" in res.stderr, res


@pytest.mark.parametrize(("argv", "child", "timeout", "cmd"), [
    (["ID", "--", "echo", "hi"], "ID", None, ["echo", "hi"]),
    (["ID", "--timeout", "5", "--", "echo"], "ID", 5.0, ["echo"]),  # options after the id, before --
    (["--timeout", "1m", "-e", "A=1", "ID", "--", "sh", "-c", "x --y"], "ID", 60.0, ["sh", "-c", "x --y"]),
    (["-w", "/tmp", "ID", "ls", "-l"], "ID", None, ["ls", "-l"]),  # docker's rule without --
    (["-it", "--timeout=2", "ID", "sh", "-e"], "ID", 2.0, ["sh", "-e"]),
    (["-ie", "A=1", "ID", "env", "-u", "X"], "ID", None, ["env", "-u", "X"]),  # a cluster ending in a valued flag
])
def test_exec_options_go_anywhere_before_the_command(argv, child, timeout, cmd):
    """Parsed by the one command tree (click), after docker_argv placed the `--` the user may leave out."""
    exec_cmd = command_tree(app).commands["exec"]
    params = exec_cmd.make_context("exec", streams.docker_argv(argv)).params
    assert (params["child"], params["timeout"], list(params["cmd"])) == (child, timeout, cmd)


def test_completion_never_fails_and_finds_nothing_in_an_empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKD_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("FORKD_NO_DAEMON", "1")
    assert complete_children("") == [] and complete_snapshots("x") == [] and complete_pools("") == []
    monkeypatch.setenv("FORKD_HOME", "/proc/nonexistent-forkd-home")  # not even creatable: still a list
    assert complete_children("") == []


def test_completion_script_is_offered(tmp_path, monkeypatch):
    # typer finds the shell from the process tree (none under pytest here); its test switch takes it as a value
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    res = _forkd(tmp_path, "--show-completion", "bash")
    assert res.returncode == 0 and "complete" in res.stdout, res
