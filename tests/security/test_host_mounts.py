"""A build killed mid-way leaves mounts in its work tree; removing that tree must never walk into them
(SECURITY.md section 3). Seen for real: a killed test run left mmdebstrap's bind of the host's /dev/shm inside a
Debian build's `root/`, and a recursive delete of the dead build's tree emptied the host's /dev/shm (every
FORKD_HOME's flat images). Real mounts, as root, in this machine's mount namespace; the "host" directories here are
tmpfs mounts the test makes itself, never the host's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.base import mounts
from forkd.base.mounts import detach, mounts_beneath, private_mounts
from forkd.base.paths import Layout
from forkd.image.rootfs import workspace
from forkd.sandbox import gc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")

# a builder that made its owned work directory and died (what a kill -9 of mmdebstrap's parent leaves)
DEAD_BUILDER = """
import sys
from pathlib import Path
from forkd.base.owners import owned_name
from forkd.base.paths import Layout
from forkd.base.private import make_private_dir
lay = Layout(Path(sys.argv[1])).ensure()
print(make_private_dir(lay.tmp / owned_name("deb-0123456789abcdef")))
"""


@pytest.fixture
def host_dir(tmp_path):
    """A stand-in for a host directory such as /dev/shm: its own tmpfs with a file in it. Every mount beneath
    tmp_path is detached afterwards, whatever the test did."""
    d = tmp_path / "host-shm"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "forkd-test", str(d)], check=True)
    (d / "other-home-flat.mem").write_bytes(b"keep me")
    yield d
    for point in mounts_beneath(tmp_path):
        detach(point)


def bind_like_mmdebstrap(host: Path, root: Path) -> None:
    """What mmdebstrap's root mode does inside the tree it builds: the host's directory bound into it, and a
    filesystem of the guest's own beneath (deepest first matters when they nest)."""
    (root / "dev" / "shm").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host), str(root / "dev" / "shm")], check=True)
    (root / "run").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "guest-run", str(root / "run")], check=True)


def test_gc_removes_a_dead_builds_tree_without_walking_into_its_mounts(tmp_path, host_dir):
    home = tmp_path / "home"
    work = Path(subprocess.run([sys.executable, "-c", DEAD_BUILDER, str(home)], capture_output=True, text=True,
                               check=True, env=dict(os.environ, PYTHONPATH=os.getcwd())).stdout.strip())
    bind_like_mmdebstrap(host_dir, work / "root")
    assert len(mounts_beneath(work)) == 2

    report = gc.collect(Layout(home))

    assert str(work) in report.temporaries
    assert (host_dir / "other-home-flat.mem").read_bytes() == b"keep me"  # a plain rmtree deletes it
    assert not work.exists() and mounts_beneath(home) == []


def test_a_build_workspace_is_removed_without_walking_into_its_mounts(tmp_path, host_dir):
    layout = Layout(tmp_path / "home").ensure()
    with pytest.raises(RuntimeError), workspace(layout, "deb-0123456789abcdef") as (root, _out, _stage):
        bind_like_mmdebstrap(host_dir, root)
        work = root.parent
        raise RuntimeError("the build failed with its mounts still there")
    assert (host_dir / "other-home-flat.mem").read_bytes() == b"keep me"
    assert not work.exists() and mounts_beneath(layout.home) == []


def test_remove_tree_deletes_nothing_while_a_mount_beneath_stays(tmp_path, host_dir, monkeypatch):
    tree = tmp_path / "tree"
    bind_like_mmdebstrap(host_dir, tree)
    (tree / "file").write_text("x")

    def refused(point):  # what the kernel answers a forkd without CAP_SYS_ADMIN
        raise PermissionError(1, "Operation not permitted", str(point))

    monkeypatch.setattr(mounts, "detach", refused)
    left = mounts.remove_tree(tree)
    assert sorted(map(str, left)) == sorted([str(tree / "dev" / "shm"), str(tree / "run")])
    assert (tree / "file").exists() and (host_dir / "other-home-flat.mem").exists()  # nothing deleted
    monkeypatch.undo()
    assert mounts.remove_tree(tree) == [] and not tree.exists()  # detached, then deleted
    assert (host_dir / "other-home-flat.mem").read_bytes() == b"keep me"


def test_remove_tree_refuses_a_link_and_the_root(tmp_path, host_dir):
    link = tmp_path / "link"
    link.symlink_to(host_dir)
    with pytest.raises(ValueError):
        mounts.remove_tree(link)  # nothing beneath the link's target is detached or deleted
    assert mounts_beneath(host_dir) == [host_dir] and (host_dir / "other-home-flat.mem").exists()
    with pytest.raises(ValueError):
        mounts.remove_tree(Path("/"))


def test_mounts_made_under_private_mounts_die_with_their_process(tmp_path):
    point = tmp_path / "point"
    point.mkdir()
    proc = subprocess.Popen(private_mounts(["sh", "-c", f"mount -t tmpfs -o size=1m inner {point} && echo mounted "
                                                         "&& exec sleep 600"]),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "mounted"
        theirs = Path(f"/proc/{proc.pid}/mountinfo").read_text()
        assert f" {point} " in theirs  # the mount exists, in the process's own namespace
        assert mounts_beneath(tmp_path) == []  # and nowhere in ours
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert mounts_beneath(tmp_path) == []
