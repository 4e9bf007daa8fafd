"""Disk-backed guest images (issue 9): the rootfs is an ext4 root disk, the parent writes its own qcow2 overlay
(frozen with the snapshot) and every child writes a private overlay on that, on real VMs.

The OCI image is the three-layer test image of tests/oci_images.py, built with `rootfs="disk"`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forkd.base.hashing import sha256_file
from forkd.core import images as core_images
from forkd.core.requests import Branch, Compaction, LayerBuild, ParentBuild, Spawn
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
    from forkd.cli.output import size
    from tests.conftest import forkd_cli

    res = forkd_cli("snapshot-info", TAG, "-o", "json", check=True)
    info = json.loads(res.stdout)
    assert info["disk_sha256"] == disk_snap[0].disk_sha256 and info["disk_bytes"] > 0
    assert "disk_sha256" in forkd_cli("snapshot-info", TAG, check=True).stdout
    table = forkd_cli("snapshots", check=True).stdout.splitlines()
    assert "DISK" in table[0].split()
    line = next(line for line in table if line.split()[:1] == [TAG])
    assert size(info["disk_bytes"]) in line  # its disk's allocated size
    base_line = next(line for line in table if line.split()[:1] == ["base"])
    assert " - " in base_line  # a snapshot without a disk


@pytest.mark.vm
def test_layer_and_compaction_of_a_disk_backed_chain(rt, fork, disk_snap):
    rt.snapshot_diff(LayerBuild.of(tag="oci-disk-l1", parent_tag=TAG, run=("echo layer1 > /srv/l1.txt && sync",)))
    rt.snapshot_diff(LayerBuild.of(tag="oci-disk-l2", parent_tag="oci-disk-l1",
                                   run=("echo layer2 > /srv/l2.txt && rm /srv/parent.txt && sync",)))
    l1, l2 = rt.store.get("oci-disk-l1"), rt.store.get("oci-disk-l2")
    assert l1.has_disk and l2.has_disk and l2.parent_tag == "oci-disk-l1"
    # each layer's overlay names its parent's, relatively: the chain is the snapshot chain
    names = [Path(i["filename"]).parent.name + "/" + Path(i["filename"]).name
             for i in vdisk.chain(rt.store.disk_path("oci-disk-l2"))]
    assert names == ["oci-disk-l2/disk.qcow2", "oci-disk-l1/disk.qcow2", f"{TAG}/disk.qcow2",
                     f"{disk_snap[1].id}/rootfs.ext4"]
    want = "from-parent\nlayer1\nnone\n"
    (c1,) = fork(1, tag="oci-disk-l1")
    assert sh(rt, c1.id, "cat /srv/parent.txt /srv/l1.txt; test -e /srv/l2.txt || echo none") == want
    (c2,) = fork(1, tag="oci-disk-l2")
    assert sh(rt, c2.id, "cat /srv/l1.txt /srv/l2.txt; test -e /srv/parent.txt || echo gone") == \
        "layer1\nlayer2\ngone\n"
    rt.compact(Compaction.of(from_tag="oci-disk-l2", to_tag="oci-disk-flat"))
    flat = rt.store.get("oci-disk-flat")
    assert flat.has_disk and flat.parent_tag is None
    assert [Path(i["filename"]).name for i in vdisk.chain(rt.store.disk_path("oci-disk-flat"))] == \
        ["disk.qcow2", "rootfs.ext4"]
    rt.rmi("oci-disk-l1", cascade=True, force=True)  # the compacted base does not need the chain any more
    (c3,) = fork(1, tag="oci-disk-flat")
    assert sh(rt, c3.id, "cat /srv/l1.txt /srv/l2.txt; test -e /srv/parent.txt || echo gone") == \
        "layer1\nlayer2\ngone\n"


@pytest.mark.vm
@pytest.mark.parametrize("mode", ["full", "live", "diff"])
def test_branch_of_a_disk_backed_child_captures_its_disk(rt, fork, disk_snap, mode):
    from forkd.core.branch import branch

    (src,) = fork(1, tag=TAG)
    sh(rt, src.id, "echo before-branch > /srv/state.txt")  # in the page cache and the overlay: both captured
    res = branch(rt, Branch.of(child_id=src.id, tag=f"disk-br-{mode}", mode=mode))
    snap = res.snapshot
    assert snap.status == "ready" and snap.has_disk, snap
    assert "disk_copy" in res.timings_ms
    # live: copied while the guest's filesystem was frozen (the VM running), and thawed again
    assert (("fs_freeze" in res.timings_ms and "fs_frozen" in res.timings_ms) == (mode == "live")), res.timings_ms
    # the source goes on (its filesystem writable at once, not after the guest's own 10 s freeze limit), and
    # what it writes after the branch is not in the branch
    sh(rt, src.id, "timeout 5 sh -c 'echo after-branch > /srv/state.txt && sync'")
    # full/live: the branch's disk depends on the image only (its source snapshot may be deleted); diff: a layer's
    # overlay, backed by its source snapshot's disk
    chain = [Path(i["filename"]) for i in vdisk.chain(rt.store.disk_path(snap.tag))]
    if mode == "diff":
        assert snap.parent_tag == TAG and chain[1].resolve() == rt.store.disk_path(TAG).resolve(), chain
    else:
        assert [p.name for p in chain] == ["disk.qcow2", "rootfs.ext4"]
    (c,) = fork(1, tag=snap.tag)
    assert sh(rt, c.id, "cat /srv/state.txt") == "before-branch\n"
    sh(rt, c.id, "timeout 5 sh -c 'echo child > /srv/child.txt && sync'")  # restored frozen, thawed by forked
    sh(rt, c.id, "echo 3 > /proc/sys/vm/drop_caches")
    assert sh(rt, c.id, "cat /srv/state.txt /srv/parent.txt") == "before-branch\nfrom-parent\n"
    assert sh(rt, src.id, "cat /srv/state.txt") == "after-branch\n"


@pytest.mark.vm
def test_spec_image_ref_with_rootfs_and_template_pruning(rt, fork, disk_snap, layout_dir, monkeypatch):
    from forkd.spec.models import ImageRef

    monkeypatch.setenv("FORKD_IMAGE_ROOTS", str(layout_dir.parent))  # specs take images only from allowed roots
    ref = ImageRef.model_validate({"oci": {"ref": str(layout_dir), "rootfs": "disk"}})
    # the reconciler's resolution of a ForkParent's image: the disk-backed image already built (a cache hit)
    assert core_images.ensure_image(rt, ref.model_dump(mode="json"), memory_mib=384) == disk_snap[1].id
    assert ImageRef.model_validate({"oci": {"ref": "/x"}}).model_dump() == {"oci": {"ref": "/x"}}  # hash-stable
    with pytest.raises(ValueError, match="rootfs"):
        ImageRef.model_validate({"oci": {"ref": "/x", "rootfs": "ext4"}})
    # a child of a throw-away disk snapshot leaves an overlay template; deleting the snapshot prunes it
    rt.snapshot_diff(LayerBuild.of(tag="oci-disk-tmp", parent_tag=TAG, run=("true",)))
    (c,) = fork(1, tag="oci-disk-tmp")
    templates = set(rt.overlay_templates.glob("*.qcow2"))
    assert any(vdisk.backing_of(t) == rt.store.disk_path("oci-disk-tmp") for t in templates)
    rt.kill([c.id])
    rt.rmi("oci-disk-tmp")
    left = set(rt.overlay_templates.glob("*.qcow2"))
    assert left < templates and all(vdisk.backing_of(t).is_file() for t in left)


@pytest.mark.vm
def test_isolated_network_and_memory_limit_with_a_disk(rt, disk_snap):
    """NIC and root disk together (the device order parents and children must share), in a child's own network
    namespace and cgroup."""
    snap = rt.create_snapshot(ParentBuild.of(tag="oci-disk-net", memory_mib=384, network="isolated",
                                              image_id=disk_snap[1].id))
    assert snap.has_disk and snap.network == "isolated"
    (c,) = rt.fork(Spawn.of(tag="oci-disk-net", n=1, memory_limit_mib=512))
    try:
        assert c.netns and c.memory_limit_mib == 512
        assert "10.42.0.2/24" in sh(rt, c.id, "ip -o addr show eth0")
        assert sh(rt, c.id, "echo net-and-disk > /srv/x && sync && cat /srv/x") == "net-and-disk\n"
    finally:
        rt.kill([c.id])
        rt.rmi("oci-disk-net")


@pytest.mark.vm
def test_live_branch_pauses_the_vm_when_the_agent_is_busy(rt, fork, disk_snap):
    """Another host connection holds the child's agent, so its filesystem cannot be frozen: the branch pauses
    the VM for the disk copy instead, and the result is just as consistent."""
    from forkd.core.branch import branch
    from forkd.vmm.agent_client import AgentClient

    (src,) = fork(1, tag=TAG)
    sh(rt, src.id, "echo held > /srv/state.txt")
    holder = AgentClient(Path(src.dir) / "agent.sock")
    try:
        holder.ping()
        res = branch(rt, Branch.of(child_id=src.id, tag="disk-br-held", mode="live"))
    finally:
        holder.close()
    assert res.snapshot.status == "ready" and "disk_copy" in res.timings_ms
    assert "fs_freeze" not in res.timings_ms
    (c,) = fork(1, tag="disk-br-held")
    assert sh(rt, c.id, "cat /srv/state.txt") == "held\n"
    sh(rt, src.id, "timeout 5 sh -c 'echo after > /srv/state.txt && sync'")


def _held_files(pid: int) -> set[str]:
    fds = Path(f"/proc/{pid}/fd")
    return {os.readlink(fds / n) for n in os.listdir(fds)}


@pytest.mark.vm
def test_a_disk_backed_childs_vmm_drops_root_and_holds_its_chain_as_descriptors(rt, fork, disk_snap):
    """The jail holds for a VMM with a disk too: its own uid, chrooted into the empty root, its qcow2 chain
    opened by the driver (no image path resolves for it), and a save (a migration, which reopens every image)
    still works: the branch tests below run on such VMMs."""
    from forkd.vmm.qemu_cmdline import empty_root

    (c,) = fork(1, tag=TAG)
    uid = int(Path(f"/proc/{c.pid}/status").read_text().split("\nUid:\t", 1)[1].split()[0])
    assert uid != 0 and c.runas == f"{uid}:{uid}"
    assert os.readlink(f"/proc/{c.pid}/root") == str(empty_root())
    held = _held_files(c.pid)
    chain = [str(Path(c.dir) / "disk.qcow2"), str(rt.store.disk_path(TAG)), str(disk_snap[1].disk)]
    assert all(os.path.realpath(f) in held for f in chain), (chain, held)
    assert sh(rt, c.id, "echo jailed > /srv/j.txt && sync && cat /srv/j.txt") == "jailed\n"


@pytest.mark.vm
def test_a_branch_refuses_an_overlay_whose_header_its_vmm_rewrote(rt, fork, disk_snap):
    """A compromised VMM holds its overlay read-write: pointing the header's backing name at a host file must not
    make a snapshot (root's qemu-img would open that file when it rebases the branch's disk)."""
    import struct

    from forkd.base.errors import ForkdError
    from forkd.core.branch import branch

    (src,) = fork(1, tag=TAG)
    own = Path(src.dir) / "disk.qcow2"
    with open(own, "r+b") as f:  # what the VMM could write through its descriptor
        head = f.read(4096)
        b_off = struct.unpack_from(">Q", head, 8)[0]
        evil = b"/etc/shadow"
        f.seek(b_off)
        f.write(evil)
        f.seek(16)
        f.write(struct.pack(">I", len(evil)))
    with pytest.raises(ForkdError, match="refused disk overlay"):
        branch(rt, Branch.of(child_id=src.id, tag="disk-br-evil", mode="full"))
    assert all(getattr(s, "tag", None) != "disk-br-evil" or s.status != "ready" for s in rt.store.list())
