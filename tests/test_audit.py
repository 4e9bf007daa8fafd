"""The hash-chained audit log: mutating API calls and reconciler actions of a real daemon are recorded;
`forkd audit verify` says OK, then catches an edited line, a removed line and a truncated tail. The daemon runs
the fake VMM driver (tests/fake_vmm.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from forkd.core.audit import GENESIS, AuditLog, token_id, verify
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon


def cli_verify(home) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", "audit", "verify"], capture_output=True,
                          text=True, env=dict(os.environ, FORKD_HOME=str(home)), timeout=120)


def test_chain_and_tamper_detection(tmp_path):
    log = AuditLog(tmp_path)
    for i in range(5):
        log.append("unix:0", "POST /v1/x", f"t{i}", "ok", 1.5)
    lines = (tmp_path / "audit.log").read_text().splitlines()
    assert json.loads(lines[0])["prev"] == GENESIS
    assert (tmp_path / "audit.log").stat().st_mode & 0o777 == 0o600
    assert verify(tmp_path).ok and cli_verify(tmp_path).returncode == 0
    assert "OK" in cli_verify(tmp_path).stdout

    def tampered(mutate) -> subprocess.CompletedProcess:
        d = tmp_path / f"copy{time.monotonic_ns()}"
        d.mkdir()
        for name in ("audit.log", "audit.head"):
            shutil.copy(tmp_path / name, d / name)
        p = d / "audit.log"
        p.write_text(mutate(p.read_text()))
        return cli_verify(d)

    res = tampered(lambda s: s.replace('"target":"t2"', '"target":"t9"'))  # edit a line
    assert res.returncode == 1 and "line 4" in res.stdout, res.stdout
    res = tampered(lambda s: "\n".join(s.splitlines()[:1] + s.splitlines()[2:]) + "\n")  # remove a line
    assert res.returncode == 1 and "line 2" in res.stdout
    res = tampered(lambda s: "\n".join(s.splitlines()[:3]) + "\n")  # cut the tail
    assert res.returncode == 1 and "truncated" in res.stdout
    res = tampered(lambda s: s[:-10])  # cut mid-line
    assert res.returncode == 1 and "cut off" in res.stdout
    assert len(token_id("x")) == 12


def test_daemon_audits_api_calls_and_reconciler_actions(home, fake_base, tmp_path):
    d = start_api_daemon(home, tmp_path)
    parent = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkParent", "metadata": {"name": "audp"},
              "spec": {"memoryMiB": 256}}
    try:
        with d.tcp() as c:
            assert c.post("/v1/parents", json=parent).status_code == 201
            deadline = time.monotonic() + 300
            while not any(cd["type"] == "Ready" and cd["status"] == "True"
                          for cd in c.get("/v1/parents/audp/status").json().get("conditions", [])):
                assert time.monotonic() < deadline, "parent never became ready"
                time.sleep(0.5)
            assert c.delete("/v1/parents/audp").status_code == 204
            with d.tcp(None) as anon:
                assert anon.delete("/v1/sandboxes/cnope").status_code == 401
        entries = [json.loads(ln) for ln in (home / "audit.log").read_text().splitlines()]
        api = [e for e in entries if e["action"] == "POST /v1/parents"]
        assert api and api[-1]["actor"] == token_id(d.token) and api[-1]["result"] == "ok"
        assert api[-1]["latency_ms"] >= 0 and api[-1]["via"] == "tcp"
        built = [e for e in entries if e["actor"] == "reconciler" and e["action"] == "BuildParent"]
        assert built and built[-1]["result"] == "ok" and "audp" in built[-1]["target"]
        denied = [e for e in entries if e["result"] == "denied"]
        assert denied and denied[-1]["actor"] == "unauthenticated" and denied[-1]["count"] >= 1  # a summary
        assert all(set(e) >= {"time", "actor", "action", "target", "result", "latency_ms", "prev"} for e in entries)
    finally:
        stop_api_daemon(d)
        for s in os.listdir(home / "snapshots"):
            if s.startswith("audp"):
                subprocess.run([sys.executable, "-m", "forkd.cli.main", "rmi", "--force", s],
                               env=dict(os.environ, FORKD_HOME=str(home)), capture_output=True, timeout=60)
    res = cli_verify(home)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout


@pytest.mark.parametrize("method,path,ctype,refused", [
    ("PUT", "/v1/sandboxes/c1/files/archive", "application/octet-stream", False),
    ("PUT", "/v1/children/c1/files/archive", "application/octet-stream", False),
    ("PUT", "/v1/children/c1/files/content", None, False),
    ("PUT", "/v1/children/c1/files", "text/plain", True),
    ("POST", "/v1/children/c1/files/mkdir", "application/octet-stream", True),
    ("POST", "/v1/children", "application/json; charset=utf-8", False),
])
def test_raw_bodies_are_accepted_on_both_child_prefixes(method, path, ctype, refused):
    """A file upload takes octet-stream under /v1/sandboxes and /v1/children alike; JSON routes refuse it."""
    from forkd.api.audit import _content_type_problem
    headers = [(b"content-type", ctype.encode())] if ctype else []
    assert (_content_type_problem({"headers": headers}, method, path) is not None) is refused
