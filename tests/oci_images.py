"""Test container images built inside the tests (no registry, no Docker): OCI image layouts and `docker save`
tarballs made from the default image's own files (busybox + Debian's Python 3.11, from the debs in
$FORKD_HOME/cache/debs), split into three tar layers: the later ones delete a file with a whiteout and make a
directory opaque. The fixtures are session-wide (registered in conftest.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from forkd.image import build as image_build
from forkd.image import oci

LAYER_GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"


def _tar_dir(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if rel in ("init",) or rel.startswith("forkd"):
                continue  # forkd injects its own
            tar.add(p, arcname=rel, recursive=False)
    return buf.getvalue()


def _write_layout(d: Path, layers: list[tuple[bytes, str]]) -> Path:
    """An OCI image layout with these (content, media type) layers."""
    blobs = d / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return "sha256:" + h

    descs = [{"mediaType": mt, "digest": blob(data), "size": len(data)} for data, mt in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in descs]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": blob(config), "size": len(config)},
                           "layers": descs}).encode()
    (d / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (d / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(manifest),
         "size": len(manifest), "platform": {"os": "linux", "architecture": "amd64"}}]}))
    return d


def _write_docker_save(path: Path, layers: list[bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
        names = []
        for i, data in enumerate(layers):
            names.append(f"layer{i}/layer.tar")
            add(names[-1], data)
        add("config.json", json.dumps({"architecture": "amd64", "os": "linux"}).encode())
        add("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["test:latest"],
                                          "Layers": names}]).encode())
    return path


@pytest.fixture(scope="session")
def layers(rt, tmp_path_factory):
    """Three layers: (1, gzip) the default image's rootfs + /etc/doomed.txt + /opt/data/old*.txt; (2, plain tar)
    a whiteout of /etc/doomed.txt, /opt/data made opaque with new.txt, /etc/added.txt; (3, gzip) one more file."""
    work = tmp_path_factory.mktemp("rootfs")
    pkgs, _ = image_build._inputs(rt.layout, lambda s: None)
    image_build._populate(work / "root", pkgs, work / "vmlinuz", lambda s: None)
    root = work / "root"
    (root / "etc/doomed.txt").write_text("delete me\n")
    (root / "opt/data").mkdir(parents=True)
    (root / "opt/data/old1.txt").write_text("old\n")
    (root / "opt/data/old2.txt").write_text("old\n")
    l1 = gzip.compress(_tar_dir(root), compresslevel=1)
    shutil.rmtree(work)
    l2 = oci.layer_tar([("etc/.wh.doomed.txt", b"", 0o644), ("opt/data/", None, 0o755),
                        ("opt/data/.wh..wh..opq", b"", 0o644), ("opt/data/new.txt", b"new\n", 0o644),
                        ("etc/added.txt", b"added in layer 2\n", 0o644)])
    l3 = gzip.compress(oci.layer_tar([("srv/", None, 0o755), ("srv/hello.py", b"print('hello from layer 3')\n", 0o644),
                                      ("usr/local/bin/", None, 0o755),
                                      ("usr/local/bin/busybox", "/bin/busybox", 0o777),
                                      # on Debian's sys.path: where --pip's .pth file goes
                                      ("usr/local/lib/python3.11/dist-packages/", None, 0o755)]))
    return [(l1, LAYER_GZ), (l2, LAYER_TAR), (l3, LAYER_GZ)]


@pytest.fixture(scope="session")
def layout_dir(layers, tmp_path_factory):
    return _write_layout(tmp_path_factory.mktemp("oci") / "img", layers)


