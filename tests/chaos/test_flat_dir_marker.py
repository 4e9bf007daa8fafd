"""A home's tmpfs directory (`$FORKD_SHM/forkd-<hash of the home>`: flat images, scratch RAM) holds a marker naming
its home; `forkd gc` removes the directory once that home is gone, and judges it by the marker alone. A process
killed while writing the marker used to leave it empty (made, then written), and gc skipped such a directory for
good: its RAM was lost once the home was deleted. Now the marker is written whole (a temporary renamed over it) and
start-up recovery marks the directory again, so a kill at that point leaves nothing gc cannot judge.

The crash harness's report that led here (a tmpfs directory of a deleted home after a round) was another home's:
gc lists those host-wide, and test homes come and go on this host; the harness now counts only its own home's
directory, by its marker. No VM; FORKD_SHM is a directory of the test's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from forkd.base.owners import dead_under
from forkd.base.paths import MARKER, Layout, stale_flat_dirs
from forkd.core.runtime import Runtime
from forkd.service.service import Service
from tests.chaos.invariants import check_orphans
from tests.chaos.test_gc_build_vmm import private_home  # noqa: F401 - a fixture

KILLED_WRITING_MARKER = """
import os, signal
from pathlib import Path
from forkd.base.paths import Layout

layout = Layout(Path(os.environ["FORKD_HOME"]))
line = (str(layout.home) + "\\n").encode()
real = os.write
def write(fd, data):
    if bytes(data) == line:  # kill -9 as the marker's text is written
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fd, data)
os.write = write
layout.make_flat_cache()
raise SystemExit(3)  # not reached
"""


@pytest.fixture
def shm(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir(mode=0o1777)
    monkeypatch.setenv("FORKD_SHM", str(d))
    return d


def test_a_process_killed_writing_the_marker_leaves_a_directory_gc_removes_once_its_home_is_gone(
        private_home, shm, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    p = subprocess.run([sys.executable, "-c", KILLED_WRITING_MARKER], env=dict(os.environ, FORKD_NO_DAEMON="1"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, f"the process was not killed where planned: {p.returncode} {p.stderr[-2000:]}"
    assert layout.shm_dir.is_dir()
    Service.on(layout).recover()  # what `forkd serve` runs at start-up
    assert (layout.shm_dir / MARKER).read_text() == f"{private_home}\n"
    assert dead_under(layout.shm_dir) == []  # the killed writer's temporary went with the recovery
    assert check_orphans(Runtime(layout), set()) == []
    shutil.rmtree(private_home)  # the home deleted without `forkd rmi`: its tmpfs directory is RAM nobody uses
    assert stale_flat_dirs() == [layout.shm_dir]


def test_the_harness_counts_its_own_tmpfs_directory_not_another_homes(private_home, shm, monkeypatch):  # noqa: F811
    """Another home's directory (its home deleted) is gc's to remove, not this home's leftover; this home's
    directory without its marker is."""
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    layout = Layout(private_home)
    other = shm / "forkd-0123456789"
    other.mkdir(mode=0o700)
    (other / MARKER).write_text(f"{private_home}-deleted\n")
    assert stale_flat_dirs() == [other]
    assert check_orphans(Runtime(layout), set()) == []
    layout.make_flat_cache()
    (layout.shm_dir / MARKER).write_bytes(b"")  # what a process killed while marking it left
    assert [v for v in check_orphans(Runtime(layout), set()) if str(layout.shm_dir / MARKER) in v]
