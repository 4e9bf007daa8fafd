"""Fixtures for the no-VM tier: a FORKD_HOME of its own whose runtime runs the fake VMM driver (forkd/vmm/fake.py,
FORKD_VMM_DRIVER=fake), for tests of the logic above the driver (reconciler, API, pipeline, supervisor). The fake
passes the driver contract tests (tests/test_driver_contract.py); what it does not model is listed in its docstring,
and tests of those keep booting QEMU."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.core.runtime import Runtime

ENV = ("FORKD_HOME", "FORKD_VMM_DRIVER")


@pytest.fixture(scope="module")
def fake_home():
    """A module's own FORKD_HOME with FORKD_VMM_DRIVER=fake in the environment (the CLI a test starts inherits it);
    the session's home and driver come back afterwards."""
    d = Path(tempfile.mkdtemp(prefix="fkf", dir="/tmp"))
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(FORKD_HOME=str(d), FORKD_VMM_DRIVER="fake")
    yield d
    from tests.conftest import qemu_pids

    booted = qemu_pids(d)
    try:
        Runtime(Layout(d)).kill(all_=True)
        assert not booted, f"QEMU ran in the fake driver's home {d}: {booted}"
    finally:
        shutil.rmtree(Layout(d).flat_cache.parent, ignore_errors=True)  # flat images on tmpfs
        shutil.rmtree(d, ignore_errors=True)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def fake_rt(fake_home) -> Runtime:
    rt = Runtime(Layout(fake_home))
    assert rt.driver.name == "fake"
    return rt


@pytest.fixture(scope="module")
def fake_base(fake_rt):
    """conftest's `base` on the fake driver: a warm snapshot tagged BASE_TAG (imports, a global, a file)."""
    from forkd.core.requests import ParentBuild
    from tests.conftest import BASE_TAG, WARM_GLOBAL

    return fake_rt.create_snapshot(ParentBuild.of(tag=BASE_TAG, memory_mib=256, warm_imports=("decimal", "random"),
                                                  warm_exec=(f"WARM_GLOBAL = {WARM_GLOBAL!r}",),
                                                  warm_run=("echo parent > /root/parent.txt",)))


# A test module runs on the fake driver by importing the ones it uses, e.g.
#     from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module's home and runtime
# Imported into a module, they stand in for conftest's session `home`, `rt` and `base` there only.
@pytest.fixture(scope="module", name="home")
def on_fake_home(fake_home):
    return fake_home


@pytest.fixture(scope="module", name="rt")
def on_fake_rt(fake_rt):
    return fake_rt


@pytest.fixture(scope="module", name="base")
def on_fake_base(fake_base):
    return fake_base
