"""A snapshot deleted while it is being compacted (the chaos harness's seed 301, round 17: `rmi` does not wait for
readers) fails the compaction as NotFound naming it, not as an internal error, and leaves no snapshot ready under
the new tag. On the fake VMM driver (no VM): the race is made exact by deleting the source from the compaction's
own progress report, between its look-up and its copy."""

from __future__ import annotations

import pytest

from forkd.base.errors import NotFound
from forkd.core.requests import Compaction, LayerBuild
from tests.conftest import BASE_TAG
from tests.fake_vmm import fake_base, fake_home, fake_rt  # noqa: F401 - fixtures


def test_a_source_deleted_mid_compaction_is_not_found(fake_rt, fake_base):  # noqa: F811
    fake_rt.snapshot_diff(LayerBuild.of(tag="race-l1", parent_tag=BASE_TAG, run=("echo l1 > /root/l1.txt",)))

    def progress(msg: str) -> None:
        if "flat image as a base" in msg:
            fake_rt.rmi("race-l1", force=True)

    with pytest.raises(NotFound, match="'race-l1' was deleted while it was being compacted"):
        fake_rt.compact(Compaction.of(from_tag="race-l1", to_tag="race-flat"), progress=progress)
    left = [s for s in fake_rt.store.list() if getattr(s, "tag", None) == "race-flat"]
    assert all(s.status != "ready" for s in left), left
