"""tests/seed.py: a test home starts with a copy of the default image (whole or not at all) and the accelerator
decision made before the tests."""

from __future__ import annotations

import json

from forkd.base.paths import Layout
from tests.seed import seed_home

IMAGE = "0123456789abcdef"


def _source(tmp_path, broken: bool = False) -> Layout:
    src = Layout(tmp_path / "src").ensure()
    img = src.images / IMAGE
    img.mkdir()
    (img / "image.json").write_text(json.dumps({"id": IMAGE}))
    (img / "initrd.img").write_bytes(b"initrd")
    if broken:  # a file the copy cannot read: it fails part-way, after image.json may already be copied
        (img / "zz-missing").symlink_to(tmp_path / "nowhere")
    (src.images / "default").write_text(IMAGE + "\n")
    src.debs.mkdir(parents=True, exist_ok=True)
    (src.debs / "busybox-static_1.35_amd64.deb").write_bytes(b"deb")
    src.accel_cache.write_text(json.dumps({"kernel-sha": {"accel": "tcg", "reason": "probed"}}))
    return src


def test_a_new_home_gets_the_default_image_and_its_packages(tmp_path):
    src, dst = _source(tmp_path), Layout(tmp_path / "dst")
    assert seed_home(dst, src)
    assert (dst.images / IMAGE / "initrd.img").read_bytes() == b"initrd"
    assert (dst.images / "default").read_text().strip() == IMAGE
    assert (dst.debs / "busybox-static_1.35_amd64.deb").read_bytes() == b"deb"
    assert json.loads(dst.accel_cache.read_text())["kernel-sha"]["accel"] == "tcg"


def test_a_copy_that_fails_leaves_no_image_to_be_taken_as_built(tmp_path):
    src, dst = _source(tmp_path, broken=True), Layout(tmp_path / "dst")
    assert not seed_home(dst, src)
    assert not (dst.images / "default").exists()
    assert [p.name for p in dst.images.iterdir()] == []  # neither the image nor its staging copy


def test_nothing_is_copied_from_a_home_without_a_default_image_or_into_the_source_itself(tmp_path):
    empty = Layout(tmp_path / "empty").ensure()
    dst = Layout(tmp_path / "dst")
    assert not seed_home(dst, empty)
    assert not dst.home.exists() or not any(dst.images.iterdir())
    src = _source(tmp_path)
    assert not seed_home(src, src)
