"""Packs: pack a layer with its base and image, unpack into an empty store and fork from it;
unpack is idempotent and refuses conflicts; hand-made malicious packs are refused with nothing written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard

from forkd.base.errors import Conflict, ForkdError
from forkd.base.hashing import sha256_file
from forkd.base.paths import Layout
from forkd.core import images as core_images
from forkd.core.pack import PACK_MANIFEST, PackError, pack, read_manifest, unpack
from forkd.core.requests import LayerBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.store.snapshot import Snapshot
from forkd.vmm import disk as vdisk
from tests.conftest import BASE_TAG, forkd_cli


def _empty_runtime() -> tuple[Runtime, Path]:
    """A runtime on an empty home in a directory of its own (what is written beside the home is this test's: /tmp
    is shared with whatever else runs on the host)."""
    d = Path(tempfile.mkdtemp(prefix="fkp", dir="/tmp"))
    return Runtime(Layout(d / "home")), d


def _drop(rt2: Runtime, d: Path) -> None:
    rt2.kill(all_=True)
    shutil.rmtree(d, ignore_errors=True)


def _state(rt2: Runtime) -> tuple:
    lay = rt2.layout
    return (sorted(os.listdir(lay.snapshots)), sorted(os.listdir(lay.images)), sorted(os.listdir(lay.tmp)),
            sorted(os.listdir(lay.home)))


@pytest.fixture(scope="module")
def layer(rt, base):
    rt.snapshot_diff(LayerBuild.of(tag="pk1", parent_tag=BASE_TAG, run=("echo packed > /root/p",)))
    yield "pk1"
    try:
        rt.rmi("pk1", force=True)
    except ForkdError:
        pass


@pytest.fixture(scope="module")
def packfile(rt, layer, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs") / "pk1.tar.zst"
    res = forkd_cli("pack", "--tag", layer, "--output-file", str(out), "-o", "json", check=True)
    assert json.loads(res.stdout)["chain"] == [BASE_TAG, layer]
    return out


@pytest.fixture
def target():
    rt2, d = _empty_runtime()
    yield rt2
    _drop(rt2, d)


@pytest.mark.vm
def test_pack_holds_the_chain_and_image_manifest_first(rt, packfile):
    m = read_manifest(packfile)
    snap = rt.store.get("pk1")
    assert m["head"] == "pk1" and m["chain"] == [BASE_TAG, "pk1"] and m["image_id"] == snap.image_id
    paths = [e["path"] for e in m["members"]]
    assert paths == [f"snapshots/{BASE_TAG}/snapshot.json", f"snapshots/{BASE_TAG}/vmstate",
                     f"snapshots/{BASE_TAG}/memory.bin", "snapshots/pk1/snapshot.json", "snapshots/pk1/vmstate",
                     "snapshots/pk1/diff.pages", "snapshots/pk1/diff.data",
                     f"images/{snap.image_id}/vmlinuz", f"images/{snap.image_id}/initrd.img",
                     f"images/{snap.image_id}/image.json"]
    assert all(e["mode"] == 0o444 and len(e["sha256"]) == 64 for e in m["members"])
    with open(packfile, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r, \
            tarfile.open(fileobj=r, mode="r|") as tar:
        names = [i.name for i in tar]
    assert names[0] == PACK_MANIFEST and names[1:] == paths  # no flat-cache files, nothing else


@pytest.mark.vm
def test_unpack_into_an_empty_store_then_fork(packfile, target):
    res = forkd_cli_env(target, "unpack", str(packfile), "-o", "json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["head"] == "pk1" and info["skipped"] == []
    assert info["installed"] == [f"images/{info['image_id']}", BASE_TAG, "pk1"]
    for tag in (BASE_TAG, "pk1"):
        snap = target.store.get(tag)
        assert snap.status == "ready"
        for f in target.store.dir(tag).iterdir():
            assert f.stat().st_mode & 0o777 == 0o400, f
    assert os.listdir(target.layout.tmp) == []
    (child,) = target.fork(Spawn.of(tag="pk1", n=1))
    assert target.exec(child.id, ["cat", "/root/p", "/root/parent.txt"])["stdout"] == "packed\nparent\n"
    # idempotent: a second unpack installs nothing and changes nothing
    before = _state(target)
    again = unpack(target, packfile)
    assert again["installed"] == [] and again["skipped"] == [f"images/{info['image_id']}", BASE_TAG, "pk1"]
    assert _state(target) == before


@pytest.mark.vm
def test_unpack_refuses_a_tag_with_other_content(rt, packfile, target):
    snap = rt.store.get(BASE_TAG)
    d = target.store.dir(BASE_TAG)
    d.mkdir()
    (d / "snapshot.json").write_text(json.dumps(snap.with_(memory_sha256="0" * 64).to_json()))
    before = _state(target)
    with pytest.raises(Conflict, match=f"snapshot '{BASE_TAG}' already exists with different content"):
        unpack(target, packfile)
    assert _state(target) == before


@pytest.mark.vm
def test_only_ready_snapshots_are_packed(rt, base, tmp_path):
    snap = rt.store.begin(rt.store.get(BASE_TAG).with_(tag="pkw", status="writing"))
    try:
        with pytest.raises(ForkdError, match="not ready"):
            pack(rt, "pkw", tmp_path / "w.tar.zst")
        assert not (tmp_path / "w.tar.zst").exists() and os.listdir(tmp_path) == []
    finally:
        rt.store.fail(snap, "test")
        rt.rmi("pkw", force=True)


@pytest.mark.vm
def test_a_truncated_pack_is_refused(packfile, target, tmp_path):
    raw = packfile.read_bytes()
    for cut in (len(raw) // 2, len(raw) - 200):
        bad = tmp_path / f"cut{cut}.tar.zst"
        bad.write_bytes(raw[:cut])
        before = _state(target)
        with pytest.raises(PackError, match="truncated|missing"):
            unpack(target, bad)
        assert _state(target) == before and os.listdir(target.layout.tmp) == []


# -- hand-made malicious packs (no VM needed) -----------------------------------------------------------
def forkd_cli_env(rt2: Runtime, *args: str) -> subprocess.CompletedProcess:
    """The real CLI against another FORKD_HOME."""
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                          env=dict(os.environ, FORKD_HOME=str(rt2.layout.home)), timeout=600)


def _entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mode": 0o444}


def _fake_files(disk: bytes | None = None, rootfs: bytes | None = None, disk_sha256: str | None = None,
                image_disk_sha256: str | None = None) -> dict[str, bytes]:
    """A one-snapshot pack's files; with `disk` / `rootfs` a disk-backed snapshot / image (the recorded hashes are
    the files' own unless given)."""
    kernel, initrd, vmstate, mem = b"kernel" * 10, b"initrd" * 10, b"vmstate" * 10, bytes(8192)
    image = {"id": "img1", "kernel_sha256": hashlib.sha256(kernel).hexdigest(),
             "initrd_sha256": hashlib.sha256(initrd).hexdigest()}
    if rootfs is not None or image_disk_sha256:
        image.update(rootfs="disk", disk_sha256=image_disk_sha256 or hashlib.sha256(rootfs or b"").hexdigest())
    snap = Snapshot(tag="evil", status="ready", created_at=0.0, memory_mib=128, vcpus=1, accel="tcg",
                    image_id="img1", kernel_sha256=image["kernel_sha256"], qemu_version="7.2",
                    memory_sha256=hashlib.sha256(mem).hexdigest(), vmstate_sha256=hashlib.sha256(vmstate).hexdigest(),
                    disk_sha256=disk_sha256 or (hashlib.sha256(disk).hexdigest() if disk is not None else None))
    files = {"snapshots/evil/snapshot.json": json.dumps(snap.to_json()).encode(), "snapshots/evil/vmstate": vmstate,
             "snapshots/evil/memory.bin": mem}
    if disk is not None:
        files["snapshots/evil/disk.qcow2"] = disk
    files.update({"images/img1/vmlinuz": kernel, "images/img1/initrd.img": initrd,
                  "images/img1/image.json": json.dumps(image).encode()})
    if rootfs is not None:
        files["images/img1/rootfs.ext4"] = rootfs
    return files


def _manifest(files: dict[str, bytes], **over) -> dict:
    m = {"format": "forkd-pack", "version": 1, "head": "evil", "chain": ["evil"], "image_id": "img1",
         "images": ["img1"], "members": [_entry(p, b) for p, b in files.items()]}
    m.update(over)
    return m


def _write_pack(path: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        raw = json.dumps(manifest).encode()
        info = tarfile.TarInfo(PACK_MANIFEST)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def _reg(name: str, data: bytes, size: int | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    return info, data


def _good_members(files: dict[str, bytes]) -> list:
    return [_reg(p, b) for p, b in files.items()]


def test_a_well_formed_fake_pack_passes_verification(target, tmp_path):
    """Control for the cases below: the same hand-made pack, unmodified, is accepted."""
    files = _fake_files()
    res = unpack(target, _write_pack(tmp_path / "ok.tar.zst", _manifest(files), _good_members(files)))
    assert res["installed"] == ["images/img1", "evil"]


def _cases(tmp_path: Path):
    files = _fake_files()
    good = _good_members(files)
    link = tarfile.TarInfo("snapshots/evil/vmstate")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../../../../etc/passwd"
    hard = tarfile.TarInfo("snapshots/evil/vmstate")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    dev = tarfile.TarInfo("snapshots/evil/vmstate")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 3
    fifo = tarfile.TarInfo("snapshots/evil/vmstate")
    fifo.type = tarfile.FIFOTYPE
    tampered = files["snapshots/evil/vmstate"][:-1] + b"X"
    big = files["snapshots/evil/vmstate"] + b"more"
    m = _manifest(files)
    return {
        "path traversal": (m, [_reg("../x", b"pwned"), *good], "'..'"),
        "traversal inside": (m, [_reg("snapshots/evil/../../../x", b"pwned"), *good], "'..'"),
        "absolute path": (m, [_reg("/tmp/forkd-pwned", b"pwned"), *good], "absolute"),
        "symlink escape": (m, [(link, None), *good[:1], *good[2:]], "symlink"),
        "hard link": (m, [(hard, None), *good[:1], *good[2:]], "hard link"),
        "device file": (m, [(dev, None), *good[:1], *good[2:]], "device file"),
        "fifo": (m, [(fifo, None), *good[:1], *good[2:]], "special file"),
        "hash mismatch": (m, [good[0], _reg("snapshots/evil/vmstate", tampered), *good[2:]], "sha256"),
        "larger than declared": (m, [good[0], _reg("snapshots/evil/vmstate", big), *good[2:]], "larger than declared"),
        "not in manifest": (m, [*good, _reg("snapshots/evil/extra", b"x")], "not listed"),
        "missing member": (m, good[:-1], "missing"),
        "manifest absolute path (upstream defect 7)": (
            dict(m, members=[*m["members"], _entry("/etc/forkd-sidecar", b"x")]), good, "absolute"),
        "manifest traversal": (
            dict(m, members=[*m["members"], _entry("snapshots/../../x", b"x")]), good, "'..'"),
        "manifest odd path": (
            dict(m, members=[*m["members"], _entry("cache/flat/x.mem", b"x")]), good, "not one of the files"),
        "manifest bad tag": (dict(m, chain=["../evil"], head="../evil"), good, "invalid snapshot tag"),
        "manifest not first": (m, [*good], None),
    }


@pytest.mark.parametrize("case", list(_cases(Path("/nonexistent"))))
def test_malicious_packs_are_refused_with_nothing_written(target, tmp_path, case):
    manifest, members, match = _cases(tmp_path)[case]
    path = tmp_path / "evil.tar.zst"
    if case == "manifest not first":
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data))
        path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
        match = "first member"
    else:
        _write_pack(path, manifest, members)
    before = _state(target)
    outside = sorted(os.listdir(target.layout.home.parent))
    with pytest.raises(PackError, match=match):
        unpack(target, path)
    assert _state(target) == before
    assert os.listdir(target.layout.tmp) == [] and os.listdir(target.layout.snapshots) == []
    assert sorted(os.listdir(target.layout.home.parent)) == outside
    assert not Path("/tmp/forkd-pwned").exists()


def test_cli_reports_a_refused_pack(target, tmp_path):
    files = _fake_files()
    path = _write_pack(tmp_path / "evil.tar.zst", _manifest(files), [_reg("../x", b"pwned"), *_good_members(files)])
    res = forkd_cli_env(target, "unpack", str(path))
    assert res.returncode == 2 and "path traversal" in res.stderr, res.stderr
    assert os.listdir(target.layout.snapshots) == []


# -- disk-backed snapshots and images -------------------------------------------------------------------
FAKE_ROOTFS = b"ext4" * 1024 + bytes(4 << 20) + b"end"  # mostly zeros: unpacked as a hole
ROOT_REF = "../../images/img1/rootfs.ext4"


def _qcow2(tmp: Path, ref: str = ROOT_REF, fmt: str = "raw", *opts: str) -> bytes:
    """A qcow2 overlay naming `ref` (`fmt`) as its backing file, as qemu-img writes it (nothing else on disk)."""
    p = tmp / f"d{len(list(tmp.glob('d*.qcow2')))}.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-F", fmt, "-b", ref, *opts, str(p), "64M"],
                   check=True, capture_output=True)
    return p.read_bytes()


def _without_backing_format(disk: bytes) -> bytes:
    """The same overlay with its backing-format header extension turned into an unknown one (QEMU would probe)."""
    b = bytearray(disk)
    i = b.index(bytes.fromhex("e2792aca"))
    b[i:i + 4] = bytes.fromhex("12345678")
    return bytes(b)


def _disk_cases(tmp: Path) -> dict:
    def without_disk() -> dict[str, bytes]:
        f = _fake_files(disk=_qcow2(tmp), rootfs=FAKE_ROOTFS)
        del f["snapshots/evil/disk.qcow2"]
        return f

    return {  # name: (files, what the refusal says)
        "disk listed without disk_sha256": (
            lambda: {**_fake_files(rootfs=FAKE_ROOTFS), "snapshots/evil/disk.qcow2": _qcow2(tmp)}, "records no disk"),
        "disk_sha256 without the disk": (without_disk, "records a disk but disk.qcow2 is missing"),
        "snapshot disk hash mismatch": (
            lambda: _fake_files(disk=_qcow2(tmp), rootfs=FAKE_ROOTFS, disk_sha256="0" * 64), "disk_sha256"),
        "image disk hash mismatch": (
            lambda: _fake_files(disk=_qcow2(tmp), rootfs=FAKE_ROOTFS, image_disk_sha256="0" * 64),
            "image.json's disk_sha256"),
        "rootfs.ext4 in an initramfs image": (
            lambda: {**_fake_files(), "images/img1/rootfs.ext4": FAKE_ROOTFS}, "not disk-backed"),
        "disk on an initramfs image": (lambda: _fake_files(disk=_qcow2(tmp)), "is not disk-backed"),
        "disk backed by an absolute path": (
            lambda: _fake_files(disk=_qcow2(tmp, "/etc/passwd"), rootfs=FAKE_ROOTFS), "must name"),
        "disk backing escapes the store": (
            lambda: _fake_files(disk=_qcow2(tmp, "../../../../../../etc/passwd"), rootfs=FAKE_ROOTFS), "must name"),
        "disk backed by another image": (
            lambda: _fake_files(disk=_qcow2(tmp, "../../images/img2/rootfs.ext4"), rootfs=FAKE_ROOTFS), "must name"),
        "disk backed as qcow2": (lambda: _fake_files(disk=_qcow2(tmp, ROOT_REF, "qcow2"), rootfs=FAKE_ROOTFS),
                                 "must name"),
        "disk without a backing format": (
            lambda: _fake_files(disk=_without_backing_format(_qcow2(tmp)), rootfs=FAKE_ROOTFS), "no format"),
        "disk with an external data file": (
            lambda: _fake_files(disk=_qcow2(tmp, ROOT_REF, "raw", "-o", f"data_file={tmp}/df.raw"),
                                rootfs=FAKE_ROOTFS), "external data file"),
        "disk not a qcow2": (lambda: _fake_files(disk=b"QFI" + bytes(4096), rootfs=FAKE_ROOTFS), "not a qcow2"),
        "disk.qcow2 in an image": (
            lambda: {**_fake_files(), "images/img1/disk.qcow2": _qcow2(tmp)}, "not one of the files"),
        "rootfs.ext4 in a snapshot": (
            lambda: {**_fake_files(), "snapshots/evil/rootfs.ext4": FAKE_ROOTFS}, "not one of the files"),
        "disk under another name": (
            lambda: {**_fake_files(), "snapshots/evil/disk.raw": _qcow2(tmp)}, "not one of the files"),
    }


def test_a_well_formed_fake_disk_pack_passes_verification(target, tmp_path):
    """Control for the cases below: a disk-backed snapshot and image, with holes kept when unpacked."""
    files = _fake_files(disk=_qcow2(tmp_path), rootfs=FAKE_ROOTFS)
    path = _write_pack(tmp_path / "ok.tar.zst", _manifest(files), _good_members(files))
    assert unpack(target, path)["installed"] == ["images/img1", "evil"]
    rootfs = target.layout.images / "img1" / "rootfs.ext4"
    assert rootfs.read_bytes() == FAKE_ROOTFS and rootfs.stat().st_blocks * 512 < 2 << 20  # the zeros are a hole
    assert (target.store.dir("evil") / "disk.qcow2").read_bytes() == files["snapshots/evil/disk.qcow2"]
    assert target.store.get("evil").disk_sha256 == hashlib.sha256(files["snapshots/evil/disk.qcow2"]).hexdigest()
    again = unpack(target, path)  # the same content in place: nothing to do
    assert again["installed"] == [] and again["skipped"] == ["images/img1", "evil"]


@pytest.mark.parametrize("case", list(_disk_cases(Path("/nonexistent"))))
def test_malformed_disk_packs_are_refused_with_nothing_written(target, tmp_path, case):
    make, match = _disk_cases(tmp_path)[case]
    files = make()
    path = _write_pack(tmp_path / "evil.tar.zst", _manifest(files), _good_members(files))
    before = _state(target)
    with pytest.raises(PackError, match=match):
        unpack(target, path)
    assert _state(target) == before
    assert os.listdir(target.layout.tmp) == [] and os.listdir(target.layout.snapshots) == []


DISK_TAG = "pk-disk"


@pytest.fixture(scope="module")
def disk_snap(rt, base, layout_dir):
    """The OCI test image, disk-backed, snapshotted after its parent wrote /srv/p.txt to the disk."""
    snap, image, _ = core_images.from_image(rt, str(layout_dir), DISK_TAG, memory_mib=384,
                                            warm_run=("echo p > /srv/p.txt && sync",), rootfs="disk")
    yield snap, image
    try:
        rt.rmi(DISK_TAG, force=True, cascade=True)
    except ForkdError:
        pass


@pytest.fixture(scope="module")
def disk_pack(rt, disk_snap, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpacks") / "disk.tar.zst"
    pack(rt, DISK_TAG, out)
    return out


def _sh(rt2: Runtime, cid: str, script: str) -> str:
    r = rt2.exec(cid, ["sh", "-c", script])
    assert r["exit_code"] == 0, r
    return r["stdout"]


@pytest.mark.vm
def test_a_disk_backed_snapshot_unpacks_into_another_home_and_forks(disk_snap, disk_pack, target):
    snap, image = disk_snap
    m = read_manifest(disk_pack)
    paths = [e["path"] for e in m["members"]]
    assert paths == [f"snapshots/{DISK_TAG}/{f}" for f in ("snapshot.json", "vmstate", "memory.bin", "disk.qcow2")] + \
        [f"images/{image.id}/{f}" for f in ("vmlinuz", "initrd.img", "image.json", "rootfs.ext4")]
    sha = {e["path"]: e["sha256"] for e in m["members"]}
    assert sha[f"snapshots/{DISK_TAG}/disk.qcow2"] == snap.disk_sha256
    assert sha[f"images/{image.id}/rootfs.ext4"] == image.meta["disk_sha256"]
    res = unpack(target, disk_pack)
    assert res["installed"] == [f"images/{image.id}", DISK_TAG]
    sdisk, rootfs = target.store.disk_path(DISK_TAG), target.image(image.id).disk
    assert vdisk.backing_of(sdisk) == rootfs  # the relative reference resolves inside the new home
    assert rootfs.stat().st_blocks * 512 < rootfs.stat().st_size // 2  # the ext4's holes are kept
    assert rootfs.stat().st_mode & 0o777 == 0o444 and sdisk.stat().st_mode & 0o777 == 0o400
    (child,) = target.fork(Spawn.of(tag=DISK_TAG, n=1))
    assert _sh(target, child.id, "cat /srv/p.txt") == "p\n"
    assert _sh(target, child.id, "echo w > /srv/w.txt && echo x > /root/x.txt && sync && "
                                 "echo 3 > /proc/sys/vm/drop_caches && cat /srv/w.txt /root/x.txt") == "w\nx\n"
    target.kill([child.id])
    assert sha256_file(sdisk) == snap.disk_sha256 and sha256_file(rootfs) == image.meta["disk_sha256"]
    before = _state(target)
    again = unpack(target, disk_pack)
    assert again["installed"] == [] and again["skipped"] == [f"images/{image.id}", DISK_TAG]
    assert _state(target) == before


@pytest.mark.vm
def test_a_disk_backed_chain_unpacks_and_forks(rt, disk_snap, target, tmp_path):
    snap, image = disk_snap
    rt.snapshot_diff(LayerBuild.of(tag="pk-disk-l", parent_tag=DISK_TAG, run=("echo l > /srv/l.txt && sync",)))
    out = tmp_path / "chain.tar.zst"
    pack(rt, "pk-disk-l", out)
    assert unpack(target, out)["installed"] == [f"images/{image.id}", DISK_TAG, "pk-disk-l"]
    assert vdisk.backing_of(target.store.disk_path("pk-disk-l")) == target.store.disk_path(DISK_TAG)
    (child,) = target.fork(Spawn.of(tag="pk-disk-l", n=1))
    assert _sh(target, child.id, "cat /srv/p.txt /srv/l.txt") == "p\nl\n"


def _rewrite(src: Path, dest: Path, edits: dict) -> Path:
    """A copy of the pack `src` with some members' bytes replaced (edits: member name -> fn(bytes) -> bytes)."""
    with open(src, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as r, \
            tarfile.open(fileobj=r, mode="r|") as tin, open(dest, "wb") as out, \
            zstandard.ZstdCompressor(level=1).stream_writer(out) as zw, \
            tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tout:
        for info in tin:
            f = tin.extractfile(info)
            if info.name in edits:
                data = edits[info.name](f.read())
                info.size = len(data)
                tout.addfile(info, io.BytesIO(data))
            else:
                tout.addfile(info, f)
    return dest


@pytest.mark.vm
def test_a_pack_with_a_tampered_disk_is_refused_with_nothing_written(rt, disk_snap, disk_pack, target, tmp_path):
    snap, image = disk_snap
    arc, sarc = f"snapshots/{DISK_TAG}/disk.qcow2", f"snapshots/{DISK_TAG}/snapshot.json"
    original = rt.store.disk_path(DISK_TAG).read_bytes()
    flipped = original[:-1] + bytes([original[-1] ^ 1])
    # a disk naming a host file beneath it, with every hash (snapshot.json's disk_sha256, the pack manifest) made
    # to agree: only the backing reference check stands between it and a child reading /etc/shadow
    hostile = _qcow2(tmp_path, "/etc/shadow")
    hostile_snap = json.dumps(dict(snap.to_json(), disk_sha256=hashlib.sha256(hostile).hexdigest())).encode()

    def manifest_with(**new: bytes):
        def edit(raw: bytes) -> bytes:
            m = json.loads(raw)
            for e in m["members"]:
                if e["path"] in new:
                    e.update(size=len(new[e["path"]]), sha256=hashlib.sha256(new[e["path"]]).hexdigest())
            return json.dumps(m).encode()
        return edit

    cases = {
        "disk changed": ({arc: lambda b: flipped}, "does not match its sha256 in the manifest"),
        "disk and pack manifest changed": (
            {arc: lambda b: flipped, PACK_MANIFEST: manifest_with(**{arc: flipped})}, "disk_sha256"),
        "hostile backing file, every hash agreeing": (
            {arc: lambda b: hostile, sarc: lambda b: hostile_snap,
             PACK_MANIFEST: manifest_with(**{arc: hostile, sarc: hostile_snap})}, "must name"),
    }
    for name, (edits, match) in cases.items():
        bad = _rewrite(disk_pack, tmp_path / "bad.tar.zst", edits)
        before = _state(target)
        with pytest.raises(PackError, match=match):
            unpack(target, bad)
        assert _state(target) == before, name
        assert os.listdir(target.layout.tmp) == [] and os.listdir(target.layout.snapshots) == [], name
        assert os.listdir(target.layout.images) == [], name
