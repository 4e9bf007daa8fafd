"""FORKD_VMM_DETACH with real cgroup v1 hierarchies: a process that starts inside a "container's" groups (made here
in the devices, freezer and pids hierarchies, the ones runc signals or freezes when it stops a container) leaves
them when it is placed in its child group, and stays in forkd's own memory group. No container or VM: a sleep
process stands in for the VMM. Skipped where the host has no cgroup v1 devices hierarchy (pure v2 needs no detach:
the child's one group is outside the daemon's)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from forkd.base.settings import settings
from forkd.sandbox import cgroups

ROOT = settings().cgroup_root
OTHER = ("devices", "freezer", "pids")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all((ROOT / h / "cgroup.procs").exists() for h in OTHER)
    or cgroups.detect() is None or cgroups.detect().version != 1,
    reason="needs root and cgroup v1 devices/freezer/pids hierarchies beside a v1 memory one")


def _groups(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        out[ctrls] = path
    return out


@pytest.fixture
def in_container_groups(tmp_path):
    """A process started inside groups of its own in OTHER (as a container's processes are), and those groups."""
    name = f"fake-pod-{uuid.uuid4().hex[:8]}"
    made = [ROOT / h / name for h in OTHER]
    for g in made:
        g.mkdir()
    procs = " ".join(str(g / "cgroup.procs") for g in made)
    proc = subprocess.Popen(["sh", "-c", f"for f in {procs}; do echo $$ > $f; done; echo in; exec sleep 300"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "in\n"  # it has moved itself into them
    try:
        yield proc, name
    finally:
        proc.kill()
        proc.wait()
        for g in made:
            g.rmdir()


def _placed(proc, name, tmp_path, monkeypatch, detach: str) -> dict[str, str]:
    monkeypatch.setenv("FORKD_VMM_DETACH", detach)
    group = cgroups.create(f"c{uuid.uuid4().hex[:10]}", str(tmp_path), 256)
    try:
        assert _groups(proc.pid)["devices"] == f"/{name}"
        group.place(proc.pid)
        return _groups(proc.pid)
    finally:
        for h in ("memory", "cpu", *OTHER):  # out of the child group again so that it can be removed
            (ROOT / h / "cgroup.procs").write_text(str(proc.pid))
        group.remove()
        cgroups.prune_empty_homes()


def test_detach_leaves_the_containers_groups(in_container_groups, tmp_path, monkeypatch):
    proc, name = in_container_groups
    got = _placed(proc, name, tmp_path, monkeypatch, "1")
    assert all(got[h] == "/" for h in OTHER), got
    assert got["memory"].startswith(f"/{cgroups.PREFIX}/"), got


def test_without_detach_it_stays_in_them(in_container_groups, tmp_path, monkeypatch):
    """The default: forkd moves a VMM only into its own memory and cpu groups."""
    proc, name = in_container_groups
    got = _placed(proc, name, tmp_path, monkeypatch, "0")
    assert all(got[h] == f"/{name}" for h in OTHER), got
    assert got["memory"].startswith(f"/{cgroups.PREFIX}/"), got
