"""The audit log is never torn for good: a short write (a real one: the kernel's file size limit)
leaves nothing behind and is named by the next append; a torn tail a crash left is cut off and recorded as a
recovery entry, at the next append or when a real daemon starts, and `forkd audit verify` reports it (TORN before,
OK with the recovery named after, TAMPERED if lines the head recorded were removed first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from forkd.core.audit import LOST, RECOVERY, AuditLog, verify
from tests.test_api import start_api_daemon, stop_api_daemon
from tests.test_audit import cli_verify

TORN = b'{"action":"POST /v1/sandboxes","actor":"unix:0","lat'  # what a crash mid-write leaves

# Appends under RLIMIT_FSIZE = the log's size + 40 bytes: the kernel writes 40 bytes of the line and returns short
# (SIGXFSZ ignored), then refuses outright; then the limit is lifted and one more append goes through.
SHORT_WRITE = """
import json, os, resource, signal, sys
from pathlib import Path
from forkd.core.audit import AuditError, AuditLog
home = Path(sys.argv[1])
log = AuditLog(home)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, ((home / "audit.log").stat().st_size + 40, hard))
errors = []
for i in range(2):
    try:
        log.append("unix:0", "DELETE /v1/sandboxes/{id}", f"lost{i}", "ok", 1.0)
    except AuditError as exc:
        errors.append(str(exc))
after_failure = (home / "audit.log").read_bytes()
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
log.append("unix:0", "POST /v1/x", "after", "ok", 1.0)
print(json.dumps({"errors": errors, "after_failure": after_failure.decode()}))
"""


def entries(home) -> list[dict]:
    return [json.loads(line) for line in (home / "audit.log").read_text().splitlines()]


def test_a_short_write_leaves_no_torn_line_and_is_named_later(tmp_path):
    log = AuditLog(tmp_path)
    for i in range(3):
        log.append("unix:0", "POST /v1/x", f"t{i}", "ok", 1.0)
    whole = (tmp_path / "audit.log").read_text()
    res = subprocess.run([sys.executable, "-c", SHORT_WRITE, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out["errors"]) == 2 and "short write" in out["errors"][0], out["errors"]
    assert out["after_failure"] == whole  # nothing of the failed lines is left
    v = verify(tmp_path)
    assert v.ok and v.lost == 2 and "2 entries could not be written" in str(v), str(v)
    lost = [e for e in entries(tmp_path) if e["action"] == LOST]
    assert [e["target"] for e in lost[0]["entries"]] == ["lost0", "lost1"] and lost[0]["count"] == 2
    assert entries(tmp_path)[-1]["target"] == "after"
    assert cli_verify(tmp_path).returncode == 0


def test_a_torn_tail_is_reported_then_cut_and_recorded_at_the_next_append(tmp_path):
    log = AuditLog(tmp_path)
    for i in range(3):
        log.append("unix:0", "POST /v1/x", f"t{i}", "ok", 1.0)
    with open(tmp_path / "audit.log", "ab") as f:
        f.write(TORN)
    res = cli_verify(tmp_path)
    assert res.returncode == 1 and res.stdout.startswith("TORN") and "crash" in res.stdout, res.stdout
    AuditLog(tmp_path).append("unix:0", "POST /v1/x", "t3", "ok", 1.0)  # another process's next append
    v = verify(tmp_path)
    assert v.ok and v.recovered == (4,) and v.lines == 5, str(v)
    rec = entries(tmp_path)[3]
    assert rec["action"] == RECOVERY and rec["torn_bytes"] == len(TORN) and rec["lines"] == rec["head_lines"] == 3
    res = cli_verify(tmp_path)
    assert res.returncode == 0 and "torn tail" in res.stdout and "line 4" in res.stdout, res.stdout
    for i in range(2):  # and it stays OK
        log.append("unix:0", "POST /v1/x", f"u{i}", "ok", 1.0)
    assert verify(tmp_path).ok


def test_a_recovery_does_not_whitewash_removed_lines(tmp_path):
    log = AuditLog(tmp_path)
    for i in range(5):
        log.append("unix:0", "POST /v1/x", f"t{i}", "ok", 1.0)
    data = (tmp_path / "audit.log").read_bytes()
    (tmp_path / "audit.log").write_bytes(data[:data.rfind(b"\n", 0, len(data) - 1) - 20])  # lines 4-5 gone, 3 torn
    AuditLog(tmp_path).append("unix:0", "POST /v1/x", "after", "ok", 1.0)
    v = verify(tmp_path)
    assert not v.ok and not v.torn and "head recorded 5" in str(v) and str(v).startswith("TAMPERED"), str(v)


def test_a_daemon_cuts_and_records_a_torn_tail_at_start(tmp_path):
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    log = AuditLog(home)
    for i in range(2):
        log.append("unix:0", "POST /v1/x", f"t{i}", "ok", 1.0)
    with open(home / "audit.log", "ab") as f:
        f.write(TORN)
    d = start_api_daemon(home, tmp_path)
    try:
        with d.unix() as c:
            assert c.delete("/v1/sandboxes/cnope").status_code == 404  # an audited call
            verdict = c.get("/v1/audit/verify").json()
        assert verdict["ok"] and "torn tail" in verdict["text"], verdict
    finally:
        stop_api_daemon(d)
    got = entries(home)
    assert got[2]["action"] == RECOVERY and got[2]["torn_bytes"] == len(TORN)
    assert cli_verify(home).returncode == 0
    assert os.stat(home / "audit.log").st_mode & 0o777 == 0o600


FAIL_ONLY = SHORT_WRITE.split("after_failure =")[0] + "print(json.dumps(errors))\n"


def test_lost_entries_outlive_the_process_that_lost_them(tmp_path):
    """Appends fail (the file size limit stands in for a full disk) and the process dies before any append works
    again: the count survives in the head, verify says INCOMPLETE (not OK), and the next process records them."""
    log = AuditLog(tmp_path)
    log.append("unix:0", "POST /v1/x", "t0", "ok", 1.0)
    res = subprocess.run([sys.executable, "-c", FAIL_ONLY, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and len(json.loads(res.stdout)) == 2, res.stderr
    v = verify(tmp_path)
    assert not v.ok and v.pending_lost == 2 and str(v).startswith("INCOMPLETE"), str(v)
    assert cli_verify(tmp_path).returncode != 0
    AuditLog(tmp_path).append("unix:0", "POST /v1/x", "after", "ok", 1.0)  # a restarted daemon's first append
    lost = [e for e in entries(tmp_path) if e["action"] == LOST]
    assert len(lost) == 1 and lost[0]["count"] == 2
    v = verify(tmp_path)
    assert v.ok and v.lost == 2 and v.pending_lost == 0, str(v)


def test_an_edited_last_line_is_tampering(tmp_path):
    """The last line has no successor to break the chain at: only the head's hash catches an edit of it."""
    log = AuditLog(tmp_path)
    for i in range(3):
        log.append("unix:0", "DELETE /v1/sandboxes/{id}", f"t{i}", "ok", 1.0)
    path = tmp_path / "audit.log"
    path.write_text(path.read_text().replace('"target":"t2"', '"target":"xx"'))
    assert [e["target"] for e in entries(tmp_path)] == ["t0", "t1", "xx"]
    v = verify(tmp_path)
    assert not v.ok and v.bad_line == 3 and "last line differs" in v.reason, str(v)
    r = cli_verify(tmp_path)
    assert r.returncode != 0 and "TAMPERED" in r.stdout + r.stderr


def test_an_append_between_verifys_two_reads_is_not_called_tampering(tmp_path, monkeypatch):
    """`verify` reads the head and the log one after the other while a daemon may append: an append landing
    between the two reads (made here, synchronously, right after the first read returns, whichever it is) must
    leave the log verifying OK. Read log first, head second, that log looked truncated (the soak saw it)."""
    import forkd.core.audit as audit

    log = AuditLog(tmp_path)
    for i in range(3):
        log.append("unix:0", "POST /v1/children", f"c{i}", "ok", 1.0)
    first: list[str] = []

    def then_append(name, read):
        def wrapped(p):
            out = read(p)
            if not first:
                first.append(name)
                log.append("unix:0", "POST /v1/children/kill", "c0", "ok", 1.0)
            return out
        return wrapped

    monkeypatch.setattr(audit, "_read_head", then_append("head", audit._read_head))
    monkeypatch.setattr(audit, "_read_log", then_append("log", audit._read_log))
    v = verify(tmp_path)
    assert first and v.ok, (first, str(v))
    monkeypatch.undo()
    assert verify(tmp_path).ok and verify(tmp_path).lines == 4
