"""The CLI's errors name what the user typed (the flag and its value, the spec file's field) and say what to do; never
an internal model or field name, nor a regular expression. No VM: every case is refused before anything boots
(the real `forkd` CLI, in-process, on an empty home)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

INTERNALS = ("ParentBuild", "LayerBuild", "Spawn", "Compaction", "Branch", "memory_mib", "memory_limit_mib",
             "parent_tag", "to_tag", " n:", "Input should be", "^(?:", "[0-9]")


def forkd(tmp_path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, FORKD_HOME=str(tmp_path / "home"), FORKD_NO_DAEMON="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                          env=env, input=stdin, timeout=120)


@pytest.mark.parametrize("argv,says", [
    (["snapshot", "create", "--tag", "p", "--memory-mib", "1"], "--memory-mib 1: must be at least 128"),
    (["snapshot", "create", "--tag", "p", "--vcpus", "0"], "--vcpus 0: must be at least 1"),
    (["snapshot", "create", "--tag", "Bad"], "--tag Bad: invalid tag 'Bad'"),
    (["fork", "--tag", "p", "--count", "5000"], "--count 5000: must be at most 1000"),
    (["fork", "--tag", "p", "--memory-limit-mib", "3"], "--memory-limit-mib 3: must be at least 64"),
    (["snapshot-diff", "--tag", "l", "--from", "Up"], "--from Up: invalid tag 'Up'"),
    (["snapshot-compact", "--from", "a", "--to", "B_"], "--to B_: invalid tag 'B_'"),
])
def test_a_bad_flag_is_named_as_typed_with_what_to_do(tmp_path, argv, says):
    res = forkd(tmp_path, *argv)
    assert res.returncode == 2, res.stderr
    assert says in res.stderr
    flag = says.split()[0]
    assert f"hint: fix {flag} and run the command again" in res.stderr
    assert not [w for w in INTERNALS if w in res.stderr], res.stderr


def test_set_timeout_takes_a_duration_like_every_other(tmp_path):
    """`5m` gets past the parser (the child is then not found: exit 3, not a usage error); `5x` is refused naming
    the format."""
    ok = forkd(tmp_path, "set-timeout", "nosuchchild", "5m")
    assert ok.returncode == 3, ok.stderr
    assert "no child 'nosuchchild'" in ok.stderr
    bad = forkd(tmp_path, "set-timeout", "nosuchchild", "5x")
    assert bad.returncode == 2
    assert "'5x' is not a duration: use e.g. 90 (seconds), 90s, 5m, 1h30m" in " ".join(bad.stderr.split())


def test_a_bad_ttl_in_a_spec_says_the_duration_format_not_a_regex(tmp_path):
    spec = ("apiVersion: forkd.dev/v1alpha1\nkind: ForkClaim\nmetadata:\n  name: c\n"
            "spec:\n  pool: agents\n  ttl: 5 minutes\n")
    res = forkd(tmp_path, "apply", "--dry-run", "client", "-f", "-", stdin=spec)
    assert res.returncode == 2, res.stderr
    assert "'5 minutes' is not a duration: use e.g. 90 (seconds), 90s, 5m, 1h30m" in res.stderr
    assert "ttl" in res.stderr and "^(?:" not in res.stderr
