"""A guest that cannot boot says why (issue 15, finding 8), on real VMs.

Images are the default image's own files as an OCI layout (tests/oci_images.py) with one more layer on top:
a whiteout of the stdlib's `json` (what an image with Debian's python3-minimal alone looks like to the agent), or
a `sitecustomize.py` that makes the image's Python exit before the agent runs (the guest's PID 1 dies and the
kernel panics: the case where only the console says what happened)."""

from __future__ import annotations

import gzip

import pytest

from forkd.base.errors import ForkdError, InvalidInput
from forkd.core import images as core_images
from forkd.image import oci, pycheck
from tests.oci_images import LAYER_GZ, LAYER_TAR, _write_layout

SITE = "usr/lib/python3.11/sitecustomize.py"
REFUSAL = "forkd-test: this image's Python refuses to start"


def _registered(rt) -> tuple[set[str], set[str]]:
    return ({p.name for p in rt.layout.images.iterdir()}, {s.tag for s in rt.snapshots() if hasattr(s, "tag")})


def test_missing_stdlib_module_is_named_before_anything_boots(rt, layers, tmp_path):
    """The agent needs `json`: the check reads the image's stdlib, names the module and what to install, and
    no VM boots (the error is an InvalidInput raised while the image is built, and nothing is registered)."""
    layer = oci.layer_tar([("usr/lib/python3.11/.wh.json", b"", 0o644)])
    d = _write_layout(tmp_path / "nojson", [*layers, (layer, LAYER_TAR)])
    before = _registered(rt)
    with pytest.raises(InvalidInput, match=r"\bjson\b") as exc:
        core_images.from_image(rt, str(d), "nojson")
    assert "python3" in exc.value.hint and "stdlib" in exc.value.hint, exc.value.hint
    assert "before booting" in exc.value.message
    assert _registered(rt) == before


def test_agent_modules_known_to_the_check():
    """The list the check uses is the agent's own imports (read from its modules, AGENT_MODULES), not a copy."""
    needed = pycheck.agent_modules()
    assert {"json", "subprocess", "socket", "base64"} <= set(needed)
    assert "forkd" not in needed


@pytest.mark.vm
def test_boot_failure_shows_the_console_and_keeps_the_logs(rt, layers, tmp_path):
    code = f"import os, sys\nsys.stderr.write({REFUSAL!r} + '\\n')\nsys.stderr.flush()\nos._exit(3)\n"
    layer = oci.layer_tar([(SITE, code.encode(), 0o644)])
    d = _write_layout(tmp_path / "refuses", [*layers, (gzip.compress(layer), LAYER_GZ)])
    with pytest.raises(ForkdError) as exc:
        core_images.from_image(rt, str(d), "refuses")
    msg = str(exc.value)
    assert REFUSAL in msg, msg  # the console's tail is in the message
    kept = [p for p in rt.layout.logs.iterdir() if p.name.startswith("boot-refuses-")]
    assert len(kept) == 1 and str(kept[0]) in msg, (kept, msg)
    assert REFUSAL in (kept[0] / "console.log").read_text()
    assert (kept[0] / "qemu.log").exists()
    assert not any("refuses" in s.tag for s in rt.snapshots() if s.status == "ready")


def test_rootfs_auto_picks_disk_when_an_initramfs_would_not_fit(rt, layers, tmp_path):
    """256 MiB of guest RAM: an initramfs of the test image would need more (2.5 x rootfs + 256 MiB), so `auto`
    builds the disk shape (explicit `initramfs` still says what is too small and what to do). The smallest RAM a
    disk-backed guest takes keeps the rootfs (and so the disk image built) as small as the rule allows."""
    d = _write_layout(tmp_path / "img", layers)
    with pytest.raises(InvalidInput, match="too small"):
        core_images.build_oci(rt, str(d), memory_mib=256, rootfs="initramfs", any_path=True)
    image = core_images.build_oci(rt, str(d), memory_mib=256, any_path=True)[0]
    assert image.meta["rootfs"] == "disk" and image.disk is not None
