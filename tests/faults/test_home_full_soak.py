"""The soak's full-home fault (`inject.home_full`) against a real daemon whose $FORKD_HOME is a loop-mounted ext4:
run twice (the first run makes the pack the second unpacks on the full home), every promise held, the pool back at
its target after each, nothing left.

Needs root (mount); boots a parent and its children under TCG for many minutes: opt-in (FORKD_FAULTS=1)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.client.remote import RemoteBackend
from forkd.core.runtime import Runtime
from tests.chaos.rig import SPEC, Rig
from tests.faults import inject
from tests.faults.mounts import loop_ext4

spec = importlib.util.spec_from_file_location("bench_soak", Path(__file__).resolve().parents[2] / "bench/soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)

pytestmark = [pytest.mark.vm, pytest.mark.faults("long"), pytest.mark.timeout(3600),
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a loop filesystem needs root")]


@pytest.fixture
def rig_on_loop(rt, tmp_path):
    rt.build_image()  # copied into the small home
    with loop_ext4(4096) as mnt:
        rig = Rig.create(home=mnt / "home", image_from=rt.layout.home)
        rig.log_path = tmp_path / "daemon.log"  # not on the filesystem the test fills
        try:
            yield rig
        finally:
            rig.destroy()


def test_the_full_home_fault_holds_every_promise_on_a_real_daemon(rig_on_loop, tmp_path):
    rig = rig_on_loop
    rig.start_daemon()
    assert rig.apply(SPEC.format(warm=1, max_children=4)).returncode == 0
    soak.wait_warm(rig)
    rt = Runtime(Layout(rig.home))
    api = RemoteBackend(str(rt.layout.daemon_socket))
    pack_file = tmp_path / "layer.tar.zst"
    first = inject.home_full(api, rt, "cx-a", soak.parent_tag(rt), pack_file, 1)
    inject.refilled(first, rt, rig.pools)  # the pool back at its target once space is freed
    assert first.held, first.broken
    assert pack_file.exists()
    second = inject.home_full(api, rt, "cx-a", soak.parent_tag(rt), pack_file, 2)  # now with the unpack
    inject.refilled(second, rt, rig.pools)
    assert second.held, second.broken
    assert rt.gc(dry_run=True)["leftovers"] == 0
