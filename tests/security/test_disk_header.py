"""A disk overlay a VMM wrote is refused unless its header is one forkd made (SECURITY.md, VMM jail): the checks of
forkd.vmm.qcow2_header on overlays made by the real `qemu-img`, then changed as a compromised VMM holding its
overlay read-write could change them. No VM; tests/test_disk_rootfs.py shows a branch refusing such a header."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from forkd.core.pipeline.branch_disk import copy_disk
from forkd.vmm.disk import Qcow2Disks, check_written, set_backing
from forkd.vmm.qcow2_header import HeaderRefused, check_overlay

pytestmark = pytest.mark.skipif(not shutil.which("qemu-img"), reason="needs qemu-img (apt-get install qemu-utils)")


def qemu_img(*argv: str) -> None:
    res = subprocess.run(["qemu-img", *argv], capture_output=True, text=True)
    assert res.returncode == 0, (argv, res.stderr)


@pytest.fixture
def raw_base(tmp_path) -> Path:
    b = tmp_path / "rootfs.ext4"
    b.write_bytes(b"\0" * (1 << 20))
    return b


def overlay(tmp_path: Path, base: Path, *options: str, name: str = "disk.qcow2") -> Path:
    o = tmp_path / name
    qemu_img("create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), *options, str(o))
    return o


def test_an_overlay_qemu_img_made_passes_by_absolute_and_relative_name(tmp_path, raw_base):
    check_overlay(overlay(tmp_path, raw_base), raw_base, "raw")
    rel = tmp_path / "rel.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-F", "raw", "-b", raw_base.name, str(rel))
    check_written(rel, raw_base)


def test_an_external_data_file_is_refused(tmp_path, raw_base):
    o = overlay(tmp_path, raw_base, "-o", f"data_file={tmp_path}/stolen.raw")
    with pytest.raises(HeaderRefused, match="incompatible features 0x4"):
        check_written(o, raw_base)


def test_encryption_is_refused(tmp_path, raw_base):
    """The header's crypt method set, as a VMM holding the file could write it (qemu-img's own LUKS creation
    benchmarks PBKDF2 against CPU time, which fails at random on this loaded host)."""
    o = overlay(tmp_path, raw_base)
    data = bytearray(o.read_bytes())
    struct.pack_into(">I", data, 32, 2)  # 2: LUKS
    o.write_bytes(bytes(data))
    with pytest.raises(HeaderRefused, match="an encrypted image"):
        check_written(o, raw_base)


def test_another_backing_file_is_refused(tmp_path, raw_base):
    o = overlay(tmp_path, raw_base)
    qemu_img("rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "/etc/shadow", str(o))
    with pytest.raises(HeaderRefused, match="/etc/shadow"):
        check_written(o, raw_base)
    before = o.read_bytes()
    with pytest.raises(HeaderRefused):  # set_backing checks before qemu-img opens anything by the header
        set_backing(o, raw_base)
    assert o.read_bytes() == before


def test_a_backing_format_left_to_probing_or_changed_is_refused(tmp_path, raw_base):
    o = overlay(tmp_path, raw_base)
    qemu_img("rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", str(raw_base), str(o))
    with pytest.raises(HeaderRefused, match="backing format is 'qcow2'"):
        check_written(o, raw_base)
    data = bytearray(o.read_bytes())  # the backing format extension renamed to an unknown type: no format
    at = data.index(struct.pack(">I", 0xE2792ACA))
    data[at:at + 4] = struct.pack(">I", 0x12345678)
    o.write_bytes(bytes(data))
    with pytest.raises(HeaderRefused, match="backing format is None"):
        check_written(o, raw_base)


def test_internal_snapshots_and_the_corrupt_flag_are_refused(tmp_path, raw_base):
    o = overlay(tmp_path, raw_base)
    qemu_img("snapshot", "-c", "s1", str(o))
    with pytest.raises(HeaderRefused, match="internal snapshots"):
        check_written(o, raw_base)
    c = overlay(tmp_path, raw_base, name="corrupt.qcow2")
    data = bytearray(c.read_bytes())
    struct.pack_into(">Q", data, 72, 1 << 1)
    c.write_bytes(bytes(data))
    with pytest.raises(HeaderRefused, match="incompatible features 0x2"):
        check_written(c, raw_base)


@pytest.mark.parametrize("cut", [0, 50, 90, 200])
def test_short_or_foreign_files_are_refused(tmp_path, raw_base, cut):
    o = overlay(tmp_path, raw_base)
    o.write_bytes(o.read_bytes()[:cut])
    with pytest.raises(HeaderRefused):
        check_written(o, raw_base)


def test_an_extension_list_without_an_end_is_refused_within_the_first_cluster(tmp_path, raw_base):
    o = overlay(tmp_path, raw_base)
    data = bytearray(o.read_bytes())
    header_len = struct.unpack_from(">I", data, 100)[0]
    struct.pack_into(">II", data, header_len, 0xE2792ACA, 0xFFFFFF00)  # a length far past the file
    o.write_bytes(bytes(data))
    with pytest.raises(HeaderRefused, match="out of bounds|past the first cluster"):
        check_written(o, raw_base)


def test_a_link_is_not_followed(tmp_path, raw_base):
    real = overlay(tmp_path, raw_base)
    link = tmp_path / "link.qcow2"
    os.symlink(real, link)
    with pytest.raises(HeaderRefused, match="without following links"):
        check_written(link, raw_base)


def test_a_branch_copy_of_a_rewritten_overlay_is_refused(tmp_path, raw_base):
    o = overlay(tmp_path, raw_base)
    qemu_img("rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "/etc/shadow", str(o))
    with pytest.raises(HeaderRefused):
        copy_disk(o, tmp_path / "copy.qcow2", raw_base, {}, Qcow2Disks())
