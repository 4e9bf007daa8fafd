"""Children -> each other through merged pages (SECURITY.md section 9), with real QEMU: by default no page of a
child's VMM can be merged by the kernel's KSM with another process's page (neither its guest RAM, which QEMU
would mark mergeable by default, nor its heap and TCG code buffer); FORKD_VMM_KSM=1 makes both mergeable for
hosts that trade that side channel for memory (bench/density.py --compare --variants after,ksm measures it)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from forkd.vmm import ksm

pytestmark = pytest.mark.vm


def guest_ram_mergeable(pid: int) -> list[bool]:
    """For each mapping of the child's guest RAM (its flat image), whether the kernel may merge its pages."""
    blocks = re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path(f"/proc/{pid}/smaps").read_text())
    ram = [b for b in blocks if "/flat/" in b.splitlines()[0]]
    return ["mg" in re.search(r"VmFlags:(.*)", b).group(1).split() for b in ram]


def test_children_pages_are_not_mergeable_by_default(rt, fork, monkeypatch):
    monkeypatch.delenv("FORKD_VMM_KSM", raising=False)
    (c,) = fork(1)
    assert guest_ram_mergeable(c.pid) == [False]
    assert ksm.merge_any(c.pid) is False
    assert "merge=off" in Path(f"/proc/{c.pid}/cmdline").read_bytes().decode().replace("\0", " ")


def test_ksm_opt_in_makes_the_whole_vmm_mergeable(rt, fork, monkeypatch):
    monkeypatch.setenv("FORKD_VMM_KSM", "1")
    try:
        (c,) = fork(1)
        assert guest_ram_mergeable(c.pid) == [True]
        assert ksm.merge_any(c.pid) is True
        assert rt.exec(c.id, ["true"])["exit_code"] == 0
    finally:
        monkeypatch.delenv("FORKD_VMM_KSM")
        ksm.inherit_merge(False)  # this process passes the switch on: back to the default for later tests
    assert ksm.merge_any(os.getpid()) is False
