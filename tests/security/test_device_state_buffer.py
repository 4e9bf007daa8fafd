"""A diff branch's device state comes from the source's VMM, which keeps running the guest's code (SECURITY.md
section 7): forkd hands it a memfd of its own, reads what it wrote at its answer, bounded and checked, and
writes that into the snapshot. Here the test plays the compromised VMM on the real buffer: it writes through the
descriptor QEMU would get (forkd.vmm.diff_capture.StateBuffer)."""

from __future__ import annotations

import os

import pytest

from forkd.base.errors import ForkdError
from forkd.vmm import diff_capture
from forkd.vmm.diff_capture import STREAM_MAGIC, StateBuffer


def _as_vmm(buf: StateBuffer, data: bytes) -> int:
    fd = buf.writer()
    os.write(fd, data)
    return fd


def test_what_the_vmm_writes_after_its_answer_never_reaches_the_snapshot(tmp_path):
    buf = StateBuffer()
    fd = _as_vmm(buf, STREAM_MAGIC + b"\x04honest state")
    try:
        buf.take()  # at QEMU's answer, the VM still stopped
        os.pwrite(fd, STREAM_MAGIC + b"\x04rewritten later", 0)  # the VMM kept its descriptor
        os.write(fd, b"x" * 4096)
        dest = tmp_path / "vmstate"
        assert buf.write(dest) == len(STREAM_MAGIC) + 13
        assert dest.read_bytes() == STREAM_MAGIC + b"\x04honest state"
        assert dest.stat().st_mode & 0o777 == 0o600
    finally:
        os.close(fd)
        buf.close()


@pytest.mark.parametrize("data,what", [
    (b"", "not a QEMU device state"),
    (b"QEVM", "not a QEMU device state"),
    (b"\x7fELF" + bytes(64), "not a QEMU device state"),
])
def test_a_buffer_that_is_not_a_device_state_is_refused(data, what):
    buf = StateBuffer()
    fd = _as_vmm(buf, data)
    try:
        with pytest.raises(ForkdError, match=what):
            buf.take()
    finally:
        os.close(fd)
        buf.close()


def test_an_oversized_device_state_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr(diff_capture, "MAX_DEVICE_STATE", 1 << 20)
    buf = StateBuffer()
    fd = buf.writer()
    try:
        os.ftruncate(fd, 64 << 20)  # a VMM growing the buffer: refused by size, nothing allocated for it
        with pytest.raises(ForkdError, match="MiB of device state"):
            buf.take()
        assert buf.data == b""
    finally:
        os.close(fd)
        buf.close()


def test_a_restore_without_a_qemu_header_is_refused(tmp_path):
    """A snapshot's (or a pack's) vmstate is sniffed for its format before a VMM is started on it."""
    bad = tmp_path / "vmstate"
    bad.write_bytes(b"not qemu")
    with pytest.raises(ForkdError, match="not a QEMU device-state file"):
        diff_capture.state_format_args(bad)
    good = tmp_path / "good"
    good.write_bytes(STREAM_MAGIC + b"\x07")
    assert diff_capture.state_format_args(good) == []
    good.write_bytes(STREAM_MAGIC + b"\x04")
    assert diff_capture.state_format_args(good) == ["-global", "migration.send-configuration=off"]
