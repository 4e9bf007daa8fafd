"""Fault tests: the quick ones run by default; those marked `faults("long")` (VMs on a filesystem or tmpfs the test
fills: minutes under TCG) run only when asked: FORKD_FAULTS=1 (docs/faults.md)."""

from __future__ import annotations

import os

import pytest

from forkd.core.pack import pack
from tests.conftest import BASE_TAG

OPT_IN = "FORKD_FAULTS"


def pytest_collection_modifyitems(config, items):
    if os.environ.get(OPT_IN) == "1":
        return
    skip = pytest.mark.skip(reason=f"a long fault test (VMs on a filesystem it fills): run it with {OPT_IN}=1")
    for item in items:
        mark = item.get_closest_marker("faults")
        if mark is not None and "long" in mark.args:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def base_pack(rt, base, tmp_path_factory):
    """The session's base snapshot as a pack: how a fault test gives its own home the base without a boot."""
    out = tmp_path_factory.mktemp("pack") / "base.tar.zst"
    pack(rt, BASE_TAG, out)
    return out
