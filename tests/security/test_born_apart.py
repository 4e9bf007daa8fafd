"""A process started through forkd.base.nsthread.born_apart (how every VMM starts under FORKD_VMM_JAIL) is pid 1 of
a pid namespace of its own and has a mount namespace of its own whose mounts are slaves of the host's, while the
caller's threads keep the host's namespaces. With ordinary processes: no VM; tests/security/test_vmm_privileges.py
shows the same on children's VMMs."""

from __future__ import annotations

import os
import subprocess

import pytest

from forkd.base import nsthread


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], start_new_session=True, close_fds=True)


def _ns(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def _nspid(pid: int) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        return next(line for line in f if line.startswith("NSpid:")).split()[1:]


@pytest.fixture
def started():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_process_born_apart_is_pid_1_of_its_own_namespaces(started):
    host = {k: _ns("thread-self", k) for k in ("mnt", "pid", "net")}
    a = nsthread.born_apart(_sleeper)
    b = nsthread.born_apart(_sleeper)
    started += [a, b]
    for p in (a, b):
        assert _nspid(p.pid) == [str(p.pid), "1"]  # its own pid from here, pid 1 inside
        assert _ns(p.pid, "mnt") != host["mnt"] and _ns(p.pid, "pid") != host["pid"]
        assert _ns(p.pid, "net") == host["net"]  # no netns asked for
    assert _ns(a.pid, "mnt") != _ns(b.pid, "mnt") and _ns(a.pid, "pid") != _ns(b.pid, "pid")
    assert {k: _ns("thread-self", k) for k in ("mnt", "pid", "net")} == host  # the caller is where it was
    assert _ns("self", "pid_for_children") == host["pid"]


def _tags(pid: int | str, mountpoint: str) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as f:
        line = next(x.split() for x in f if x.split()[4] == mountpoint)
    return line[6:line.index("-")]


def test_its_mounts_are_slaves_of_the_hosts(started, tmp_path):
    """A shared mount the test makes shows in the new view as a slave: what the host mounts there still reaches
    it, nothing mounted in it reaches the host."""
    m = tmp_path / "shared"
    m.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "forkd-test", str(m)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(m)], check=True)
        assert any(t.startswith("shared:") for t in _tags("self", str(m)))
        p = nsthread.born_apart(_sleeper)
        started.append(p)
        tags = _tags(p.pid, str(m))
        assert any(t.startswith("master:") for t in tags) and not any(t.startswith("shared:") for t in tags), tags
        (m / "later").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "forkd-later", str(m / "later")], check=True)
        _tags(p.pid, str(m / "later"))  # received (StopIteration if not)
    finally:
        subprocess.run(["umount", "-R", str(m)], check=False)


def test_without_private_only_the_network_namespace_changes(started, tmp_path):
    p = nsthread.born_apart(_sleeper, private=False)
    started.append(p)
    assert _ns(p.pid, "mnt") == _ns("self", "mnt") and _nspid(p.pid) == [str(p.pid)]


def test_errors_reach_the_caller():
    with pytest.raises(FileNotFoundError):
        nsthread.born_apart(_sleeper, netns="/run/netns/forkd-no-such-namespace")
    with pytest.raises(ValueError, match="boom"):
        nsthread.born_apart(lambda: (_ for _ in ()).throw(ValueError("boom")))
