"""Guest images from OCI image layouts, `docker save` tarballs and Debian package sets (issue 9), on real VMs.

The container image is made inside the test from the default image's own files (busybox + Debian's Python 3.11,
from the debs in $FORKD_HOME/cache/debs), split into three tar layers: the later ones delete a file with a
whiteout and make a directory opaque."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import time
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput, NotFound
from forkd.core import images as core_images
from forkd.image import oci, rootfs
from forkd.spec.models import ImageRef
from tests.conftest import forkd_cli
from tests.oci_images import LAYER_GZ, LAYER_TAR, _write_docker_save, _write_layout

ROOT = Path(__file__).resolve().parent.parent
def _registered(rt) -> tuple[set[str], set[str]]:
    return ({p.name for p in rt.layout.images.iterdir()}, {s.tag for s in rt.snapshots() if hasattr(s, "tag")})


def _check_child(rt, fork, tag: str) -> None:
    (child,) = fork(1, tag=tag)
    r = rt.exec(child.id, ["sh", "-c", "cat /etc/added.txt; ls /opt/data; test -e /etc/doomed.txt; echo $?"])
    assert r["exit_code"] == 0, r
    assert r["stdout"].split() == ["added", "in", "layer", "2", "new.txt", "1"], r
    r = rt.exec(child.id, ["python3", "/srv/hello.py"])
    assert r["stdout"] == "hello from layer 3\n", r
    assert rt.eval(child.id, "json.dumps({'a': 1})")["value"] == repr('{"a": 1}')  # warm import from the parent
    assert rt.exec(child.id, ["/usr/local/bin/busybox", "echo", "hi"])["stdout"] == "hi\n"


# ---------------------------------------------------------------- the working paths (VMs)
@pytest.mark.vm
def test_oci_layout_from_image_fork_exec_whiteouts(rt, fork, layout_dir, monkeypatch):
    snap, image, built = core_images.from_image(rt, str(layout_dir), "oci-img", memory_mib=512,
                                                warm_imports=("json",), pip=("six",))
    assert built and snap.status == "ready" and snap.image_id == image.id
    assert image.meta["kind"] == "oci" and image.meta["source"]["kind"] == "oci-layout"
    assert image.meta["unpack"]["whiteouts"] == 1 and image.meta["unpack"]["opaque"] == 1
    assert image.meta["python"] == {"path": "/usr/bin/python3", "version": "3.11"}
    assert image.kernel_sha256 == rt.image().kernel_sha256  # the default image's kernel: accel probe cached
    _check_child(rt, fork, "oci-img")
    # --pip: a wheel resolved on the host for the guest's Python, importable in the guest (no guest network)
    assert image.meta["pip"]["installed"] and image.meta["pip"]["installed"][0].startswith("six-")
    (child,) = fork(1, tag="oci-img")
    r = rt.exec(child.id, ["python3", "-c", "import six; print(six.__file__)"])
    assert r["stdout"] == "/forkd/site-packages/six.py\n", r
    # built once: the same layout again is a cache hit
    t0 = time.monotonic()
    again, built_again = core_images.build_oci(rt, str(layout_dir), memory_mib=512, pip=("six",), any_path=True)
    assert not built_again and again.id == image.id and time.monotonic() - t0 < 5
    # the engine's resolution gives the same image (specs take images only from allowed roots)
    monkeypatch.setenv("FORKD_IMAGE_ROOTS", str(layout_dir.parent))
    assert core_images.ensure_image(rt, {"oci": {"ref": str(layout_dir)}}, memory_mib=512, pip=("six",)) == image.id


@pytest.mark.vm
def test_docker_save_tarball_from_cli(rt, fork, layers, tmp_path):
    tarball = _write_docker_save(tmp_path / "img.tar", [data for data, _ in layers])
    res = forkd_cli("from-image", str(tarball), "--tag", "docker-img", "--warm-import", "json", "-o", "json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "ready" and out["image"]["source"]["kind"] == "docker-save"
    _check_child(rt, fork, "docker-img")


# ---------------------------------------------------------------- bad images: clear errors, nothing registered
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_layer_blob(rt, layout_dir, tmp_path):
    bad = _copy(layout_dir, tmp_path / "bad")
    manifest = json.loads((bad / "blobs/sha256" / json.loads((bad / "index.json").read_text())["manifests"][0]
                           ["digest"].split(":")[1]).read_text())
    (bad / "blobs/sha256" / manifest["layers"][1]["digest"].split(":")[1]).unlink()
    before = _registered(rt)
    with pytest.raises(NotFound, match=r"layer 1 blob sha256:[0-9a-f]{64} not found"):
        core_images.from_image(rt, str(bad), "missing-blob")
    assert _registered(rt) == before
    res = forkd_cli("from-image", str(bad), "--tag", "missing-blob")
    assert res.returncode == 3 and "not found" in res.stderr and "Traceback" not in res.stderr


def test_unsupported_media_type_and_apt(rt, layers, tmp_path):
    bad = _write_layout(tmp_path / "zstd", [(layers[1][0], "application/vnd.oci.image.layer.v1.tar+zstd")])
    before = _registered(rt)
    with pytest.raises(InvalidInput, match="unsupported media type 'application/vnd.oci.image.layer.v1.tar\\+zstd'"):
        core_images.from_image(rt, str(bad), "zstd-img")
    with pytest.raises(InvalidInput, match="--apt"):
        core_images.from_image(rt, str(bad), "apt-img", apt=("curl",))
    with pytest.raises(NotFound, match="not found"):
        core_images.from_image(rt, str(tmp_path / "nope"), "nope-img")
    assert _registered(rt) == before


def test_rootfs_too_big_for_memory(rt, layers, tmp_path):
    big = oci.layer_tar([("var/", None, 0o755), ("var/big.bin", bytes(64 << 20), 0o644)])
    d = _write_layout(tmp_path / "big", [*layers, (gzip.compress(big, compresslevel=1), LAYER_GZ)])
    before = _registered(rt)
    with pytest.raises(InvalidInput, match="too small") as exc:
        core_images.from_image(rt, str(d), "big-img", memory_mib=512, rootfs="initramfs")
    assert "--memory-mib" in exc.value.hint
    assert _registered(rt) == before
    assert not any(rt.layout.tmp.glob("oci-*"))  # the half-built rootfs is gone too


def test_no_python_in_image(rt, tmp_path):
    bb = next(rt.layout.debs.glob("busybox-static_*.deb"), None) or pytest.skip("no busybox deb cached")
    stage = tmp_path / "bb"
    from forkd.image import debs

    debs.extract(bb, stage)
    layer = oci.layer_tar([("bin/", None, 0o755), ("bin/busybox", (stage / "bin/busybox").read_bytes(), 0o755),
                           ("bin/sh", "busybox", 0o777)])
    d = _write_layout(tmp_path / "nopy", [(layer, LAYER_TAR)])
    before = _registered(rt)
    with pytest.raises(InvalidInput, match="no python3 in the image"):
        core_images.from_image(rt, str(d), "nopy-img")
    assert _registered(rt) == before


# ---------------------------------------------------------------- unpacking safety (no VM)
def _unpack(tmp_path: Path, *layer_entries) -> Path:
    root = tmp_path / "root"
    src = oci.Source("test", "test", "sha256:x")
    for i, entries in enumerate(layer_entries):
        data = oci.layer_tar(entries)
        src.layers.append(oci.Layer(f"l{i}", "tar", lambda data=data: io.BytesIO(data)))
    oci.unpack(src, root)
    return root


@pytest.mark.parametrize("name", ["/etc/passwd", "../escape", "a/../../escape"])
def test_unsafe_member_paths_refused(tmp_path, name):
    with pytest.raises(oci.UnsafeImage):
        _unpack(tmp_path, [(name, b"x", 0o644)])


def test_symlinks_cannot_carry_writes_out_of_the_rootfs(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    # an absolute symlink in one layer, a write through it in the next: lands inside the rootfs
    root = _unpack(tmp_path, [("lnk", str(outside), 0o777)], [("lnk/pwned", b"x", 0o644)])
    assert not (outside / "pwned").exists()
    assert (root / str(outside).lstrip("/") / "pwned").read_bytes() == b"x"
    # a relative symlink climbing above the root is refused
    with pytest.raises(oci.UnsafeImage, match="above the rootfs"):
        _unpack(tmp_path / "2", [("a/", None, 0o755), ("a/up", "../../..", 0o777)])


def test_whiteouts_and_opaque_dirs(tmp_path):
    root = _unpack(tmp_path,
                   [("d/", None, 0o755), ("d/a", b"1", 0o644), ("d/sub/", None, 0o755), ("d/sub/x", b"2", 0o644),
                    ("keep", b"k", 0o644), ("gone", b"g", 0o644)],
                   [("d/new", b"3", 0o644), ("d/.wh..wh..opq", b"", 0o644), (".wh.gone", b"", 0o644)])
    assert sorted(p.name for p in (root / "d").iterdir()) == ["new"]  # same-layer siblings survive the marker
    assert (root / "keep").exists() and not (root / "gone").exists()


def test_image_ref_exactly_one():
    assert ImageRef().model_dump() == {"builtin": "python"}
    assert ImageRef.model_validate({"debian": {"packages": ["python3-numpy"]}}).debian.suite == "bookworm"
    with pytest.raises(ValueError, match="exactly one"):
        ImageRef.model_validate({"builtin": "python", "oci": {"ref": "/x"}})
    with pytest.raises(ValueError):
        ImageRef.model_validate({"debian": {"packages": ["Not A Package"]}})


def test_check_fits_messages():
    with pytest.raises(InvalidInput) as exc:
        rootfs.check_fits(200 << 20, 512, "img")
    assert "--memory-mib 768" in exc.value.hint
    rootfs.check_fits(100 << 20, 512, "img")
    with pytest.raises(InvalidInput, match="more than an initramfs can hold") as exc:
        rootfs.check_fits(3 << 30, 65536, "img")
    assert "--rootfs disk" in exc.value.hint
    assert "--rootfs disk" in pytest.raises(InvalidInput, rootfs.check_fits, 200 << 20, 512, "img").value.hint
    rootfs.check_fits(3 << 30, 512, "img", "disk")  # on a disk the rootfs does not live in guest RAM
    with pytest.raises(InvalidInput, match="too small even for a disk-backed rootfs"):
        rootfs.check_fits(3 << 30, 128, "img", "disk")
    assert [rootfs.choose_kind("auto", n) for n in (100 << 20, 3 << 30)] == ["initramfs", "disk"]
    assert rootfs.choose_kind("initramfs", 3 << 30) == "initramfs"
    # auto also goes to disk when an initramfs would not fit the guest RAM asked for (200 MiB needs > 756 MiB)
    assert [rootfs.choose_kind("auto", 200 << 20, m) for m in (512, 1024)] == ["disk", "initramfs"]
    with pytest.raises(InvalidInput, match="rootfs 'ext4'"):
        rootfs.check_rootfs_kind("ext4")


# ---------------------------------------------------------------- the numpy example (Debian path, slow)
@pytest.mark.vm
@pytest.mark.long  # mmdebstrap + a 1 GiB parent under TCG: `scripts/test.sh --long` runs it
@pytest.mark.timeout(1800)
def test_numpy_pool_example(rt):
    """specs/examples/numpy-pool.yaml through the reconciler: Debian image built (downloads cached in the
    session's FORKD_HOME), numpy imported before the pause, a pool of 4, a claimed child evals numpy."""
    from forkd.reconciler.control import Control
    from forkd.spec.loader import load_text

    path = ROOT / "specs/examples/numpy-pool.yaml"
    loaded, errors = load_text(path.read_text(), str(path))
    assert not errors, errors
    control = Control(rt)
    try:
        control.apply([(x.obj, f"{x.file}:{x.line}") for x in loaded], "test")
        ok, problems = control.reconciler.run_until_converged(1500)
        assert ok, problems
        idle = [r for r in rt.children() if r.pool == "numpy" and not r.claimed and r.status == "running"]
        assert len(idle) == 4
        (child,) = rt.claim_children("numpy", 1)
        res = rt.eval(child.id, "numpy.zeros(5).tolist()")
        assert res["value"] == "[0.0, 0.0, 0.0, 0.0, 0.0]", res
        snap = rt.store.get(child.snapshot)
        image = rt.image(snap.image_id)
        assert image.meta["kind"] == "debian" and "python3-numpy" in image.meta["installed"]
        # the image is cached by content: building it again is a hit
        again, built = core_images.build_debian(rt, ["python3-numpy"], "bookworm")
        assert not built and again.id == image.id
    finally:
        for kind, name in (("ForkPool", "numpy"), ("ForkParent", "numpy-base")):
            try:
                control.delete(kind, name)
            except Exception:  # noqa: BLE001 - already gone
                pass
        control.reconciler.run_until_converged(120)
        left = [r.id for r in rt.children() if r.pool == "numpy"]
        if left:
            rt.kill(left)
        control.reconciler.close()
