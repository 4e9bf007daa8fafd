"""A snapshot deleted while it is being packed (the crash harness's seed 408, round 43: `rmi` does not wait for
readers) fails the pack as NotFound naming it, not as an internal error, and leaves no file at the pack's path. On
the fake VMM driver (no VM): the race is made exact by deleting the snapshot from the pack's own progress report,
between its look-up and its reads."""

from __future__ import annotations

import pytest

from forkd.base.errors import NotFound
from forkd.core.pack.write import pack
from forkd.core.requests import LayerBuild
from tests.conftest import BASE_TAG
from tests.fake_vmm import fake_base, fake_home, fake_rt  # noqa: F401 - fixtures


def test_a_snapshot_deleted_mid_pack_is_not_found(fake_rt, fake_base, tmp_path):  # noqa: F811
    fake_rt.snapshot_diff(LayerBuild.of(tag="prace-l1", parent_tag=BASE_TAG, run=("echo l1 > /root/l1.txt",)))

    def progress(msg: str) -> None:
        if msg.startswith("hashing"):
            fake_rt.rmi("prace-l1", force=True)

    out = tmp_path / "p.tar.zst"
    with pytest.raises(NotFound, match="'prace-l1' was deleted while it was being packed"):
        pack(fake_rt, "prace-l1", out, progress=progress)
    assert not out.exists()
    assert not list(tmp_path.iterdir())  # no temporary left either
