"""Disk-backed guest images (issue 9): the rootfs is an ext4 root disk, the parent writes its own qcow2 overlay
(frozen with the snapshot) and every child writes a private overlay on that, on real VMs.

The OCI image is the three-layer test image of tests/oci_images.py, built with `rootfs="disk"`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forkd.base.hashing import sha256_file
from forkd.core import images as core_images
from forkd.vmm import disk as vdisk

TAG = "oci-disk"


@pytest.fixture(scope="module")
def disk_snap(rt, base, layout_dir):
    """The test image as a disk-backed image, snapshotted after the parent wrote a file to its disk."""
    snap, image, _ = core_images.from_image(rt, str(layout_dir), TAG, memory_mib=384, warm_imports=("json",),
                                            warm_run=("echo from-parent > /srv/parent.txt && sync",),
                                            rootfs="disk")
    return snap, image


def sh(rt, cid: str, script: str) -> str:
    r = rt.exec(cid, ["sh", "-c", script])
    assert r["exit_code"] == 0, r
    return r["stdout"]


@pytest.mark.vm
def test_disk_image_shape_and_boot(rt, fork, disk_snap):
    snap, image = disk_snap
    assert image.meta["rootfs"] == "disk" and image.disk is not None and image.disk.is_file()
    assert image.disk.stat().st_mode & 0o777 == 0o444
    assert image.meta["initrd_bytes"] < 8 << 20  # stage-1 only: busybox + modules, the rootfs is on the disk
    assert snap.status == "ready" and snap.has_disk
    sdisk = rt.store.disk_path(TAG)
    assert sha256_file(sdisk) == snap.disk_sha256
    # the snapshot's overlay names the image's ext4 relatively (a store moves as a whole)
    info = vdisk.chain(sdisk)
    assert info[0]["backing-filename"] == "../../images/" + image.id + "/rootfs.ext4"
    assert [Path(i["filename"]).name for i in info] == ["disk.qcow2", "rootfs.ext4"]
    (child,) = fork(1, tag=TAG)
    mounts = sh(rt, child.id, "cat /proc/mounts")
    assert any(line.split()[:3] == ["/dev/vda", "/", "ext4"] for line in mounts.splitlines()), mounts
    # what the layers did (whiteout, opaque dir) holds on the disk too; the parent's write is there
    assert sh(rt, child.id, "cat /etc/added.txt; ls /opt/data; test -e /etc/doomed.txt || echo gone").split() == \
        ["added", "in", "layer", "2", "new.txt", "gone"]
    assert sh(rt, child.id, "cat /srv/parent.txt") == "from-parent\n"
    assert rt.eval(child.id, "json.dumps([1])")["value"] == repr("[1]")  # warm import from the parent
    # the child's VMM writes only its own overlay, on the snapshot's
    own = Path(child.dir) / "disk.qcow2"
    assert vdisk.backing_of(own) == sdisk


@pytest.mark.vm
def test_children_never_see_each_others_writes_and_the_base_is_unchanged(rt, fork, disk_snap):
    snap, image = disk_snap
    image_hash, snap_hash = sha256_file(image.disk), sha256_file(rt.store.disk_path(TAG))
    assert image_hash == image.meta["disk_sha256"]
    a, b = fork(2, tag=TAG)
    for c in (a, b):  # the same path, different content, flushed to the (virtual) disk
        sh(rt, c.id, f"echo {c.id} > /srv/shared.txt && dd if=/dev/urandom of=/srv/big.bin bs=1M count=8 "
                     f"2>/dev/null && echo {c.id} >> /etc/added.txt && rm /srv/parent.txt && sync")
    sh(rt, a.id, "touch /srv/only-a && sync")
    for c in (a, b):
        assert sh(rt, c.id, "cat /srv/shared.txt") == f"{c.id}\n"
        assert sh(rt, c.id, "tail -n1 /etc/added.txt") == f"{c.id}\n"
    assert sh(rt, b.id, "test -e /srv/only-a && echo seen || echo unseen") == "unseen\n"
    # not only the page cache: drop it and read back from each child's disk
    for c in (a, b):
        sh(rt, c.id, "echo 3 > /proc/sys/vm/drop_caches")
        assert sh(rt, c.id, "cat /srv/shared.txt; md5sum /srv/big.bin | cut -c1-8") .split()[0] == c.id
    sums = {sh(rt, c.id, "md5sum /srv/big.bin").split()[0] for c in (a, b)}
    assert len(sums) == 2  # each child has its own 8 MiB of random data
    for c in (a, b):  # the writes went into each child's own overlay
        assert (Path(c.dir) / "disk.qcow2").stat().st_blocks * 512 > 8 << 20
    rt.kill([a.id, b.id])
    assert sha256_file(image.disk) == image_hash
    assert sha256_file(rt.store.disk_path(TAG)) == snap_hash
    (c,) = fork(1, tag=TAG)  # a new child starts from the snapshot's disk, not from anything a child wrote
    assert sh(rt, c.id, "cat /srv/parent.txt; test -e /srv/shared.txt || echo none") == "from-parent\nnone\n"


@pytest.mark.vm
def test_disk_snapshot_info_and_listing(rt, disk_snap):
    from tests.conftest import forkd_cli

    res = forkd_cli("snapshot-info", TAG, "-o", "json", check=True)
    info = json.loads(res.stdout)
    assert info["disk_sha256"] == disk_snap[0].disk_sha256 and info["disk_bytes"] > 0
