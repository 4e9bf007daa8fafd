"""Settings in one place: every FORKD_* name in the tree is declared in forkd.base.settings, read at call time,
validated with an error naming the variable, and listed (secrets hidden) by `forkd config`."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from forkd.base import logs
from forkd.base.errors import InvalidInput
from forkd.base.settings import NAMES, describe, read_one, settings

ROOT = Path(__file__).resolve().parent.parent
NAME_RE = re.compile(r"(?<![A-Za-z0-9_])FORKD_[A-Z0-9_]*[A-Z0-9]")  # not click's _FORKD_COMPLETE
ENV_READ_RE = re.compile(r"(os\.environ(\.get)?[\[(]|os\.getenv\()\s*[\"']FORKD_")


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "forkd").rglob("*") if p.suffix in (".py", ".sh") and p.is_file())


def test_every_forkd_name_in_the_tree_is_declared():
    used = {name for p in _sources() for name in NAME_RE.findall(p.read_text())}
    assert "FORKD_HOME" in used  # the grep sees the tree
    assert sorted(used - set(NAMES)) == []


def test_no_module_reads_a_forkd_variable_itself():
    readers = {str(p.relative_to(ROOT)) for p in _sources() if ENV_READ_RE.search(p.read_text())}
    assert not readers, f"read these through forkd.base.settings: {sorted(readers)}"


def test_read_at_call_time_and_typed(monkeypatch, tmp_path):
    monkeypatch.setenv("FORKD_HOME", str(tmp_path / "a"))
    assert settings().home == tmp_path / "a"
    monkeypatch.setenv("FORKD_HOME", str(tmp_path / "b"))
    monkeypatch.setenv("FORKD_OPERATOR_RETRY", "2.5")
    monkeypatch.setenv("FORKD_NO_DAEMON", "1")
    monkeypatch.setenv("FORKD_LOG_LEVEL", "debug")
    monkeypatch.setenv("FORKD_URL", "")  # empty counts as unset
    s = settings()
    assert (s.home, s.operator_retry, s.no_daemon, s.log_level, s.url) == (tmp_path / "b", 2.5, True, "DEBUG", None)
    monkeypatch.delenv("FORKD_NO_DAEMON")
    assert settings().no_daemon is False


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FORKD_MAX_BRANCHES", "many")
    with pytest.raises(InvalidInput, match="FORKD_MAX_BRANCHES='many'") as exc:
        settings()
    assert "FORKD_MAX_BRANCHES" in (exc.value.hint or "")
    assert read_one("operator_retry") == 10.0  # one setting alone is still readable
    with pytest.raises(InvalidInput, match="FORKD_MAX_BRANCHES"):
        read_one("max_branches")
    row = next(d for d in describe() if d.name == "FORKD_MAX_BRANCHES")
    assert (row.source, row.default) == ("invalid", 2)


def _config(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", "config", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_forkd_config_lists_every_setting_and_hides_the_token(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FORKD_HOME": str(tmp_path),
           "FORKD_TOKEN": "s3cret-token", "FORKD_ACCEL": "tcg"}
    res = _config(env, "-o", "json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(NAMES)
    assert all(r["doc"] and r["type"] for r in rows.values())
    assert rows["FORKD_HOME"] == {**rows["FORKD_HOME"], "value": str(tmp_path), "source": "env",
                                  "default": "/var/lib/forkd"}
    assert (rows["FORKD_ACCEL"]["value"], rows["FORKD_ACCEL"]["default"]) == ("tcg", None)
    assert (rows["FORKD_TOKEN"]["value"], rows["FORKD_TOKEN"]["source"]) == ("set", "env")
    assert (rows["FORKD_SHM"]["source"], rows["FORKD_SHM"]["value"]) == ("default", "/dev/shm")
    assert "s3cret-token" not in res.stdout
    yml = _config({**env, "FORKD_TOKEN": ""}, "-o", "yaml")
    assert yml.returncode == 0 and "value: unset" in yml.stdout
    bad = _config({**env, "FORKD_ACCEL": "quantum"}, "-o", "json")
    assert bad.returncode == 2
    assert next(r for r in json.loads(bad.stdout) if r["name"] == "FORKD_ACCEL")["source"] == "invalid"


def _json_lines(text: str) -> list[dict]:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line parses, or this fails
    for obj in lines:
        assert {"time", "level", "logger", "message"} <= set(obj), obj
    return lines


def test_daemon_logs_json_through_the_cli_global_option(tmp_path):
    """`forkd --log-format json --log-level info serve`: the option reaches the exec'd daemon; every stderr line is
    one JSON object with time, level, logger and message."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "FORKD_HOME": str(tmp_path)}
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "--log-format", "json", "--log-level",
                                 "info", "serve"], env=env, stdout=f, stderr=f)
    try:
        deadline = time.monotonic() + 60
        while "adopted" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    lines = _json_lines(log.read_text())
    adopted = [o for o in lines if o["logger"] == "forkd.daemon" and o["message"].startswith("adopted")]
    assert adopted and adopted[0]["level"] == "INFO"
    datetime.fromisoformat(adopted[0]["time"])


def test_operator_entry_takes_log_options():
    res = subprocess.run([sys.executable, "-m", "forkd.operator", "run", "--log-format", "yaml"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--log-format" in res.stderr


def test_json_lines_carry_extra_fields_and_tracebacks(capsys):
    logs.setup("DEBUG", "json")
    try:
        logging.getLogger("forkd.test").info("spawned %s", "c1", extra={"child": "c1", "ms": 12.5})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("forkd.test").exception("failed")
        first, second = _json_lines(capsys.readouterr().err)
        assert (first["message"], first["child"], first["ms"], first["level"]) == ("spawned c1", "c1", 12.5, "INFO")
        assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]
        logs.setup("INFO", "text")
        logging.getLogger("forkd.test").debug("hidden")
        logging.getLogger("forkd.test").warning("shown", extra={"child": "c2"})
        err = capsys.readouterr().err
        assert "hidden" not in err and "forkd.test WARNING shown child=c2" in err
        assert len([h for h in logging.getLogger().handlers if isinstance(h, logs._Handler)]) == 1
    finally:
        logging.getLogger().handlers[:] = [h for h in logging.getLogger().handlers
                                           if not isinstance(h, logs._Handler)]
        logging.getLogger().setLevel(logging.WARNING)
