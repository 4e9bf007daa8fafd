"""Shared fixtures. Tests that need VMs boot real QEMU guests (TCG here, KVM where the probe finds it works):
one session-wide FORKD_HOME per pytest process, starting with the default image and accelerator decision
scripts/setup.sh made before the tests (tests/seed.py; made again when those are not this tree's), and one warm base
snapshot VM tests fork from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from forkd.base.paths import Layout, stale_flat_dirs
from forkd.base.settings import env_name
from forkd.core.requests import ParentBuild, Spawn
from forkd.core.runtime import Runtime
from tests.seed import seed_home

BASE_TAG = "base"
WARM_GLOBAL = "set at warm-up"


def qemu_pids(home: Path) -> list[int]:
    """QEMU processes whose command line points into `home` (leak detection in tests only)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and cmd and cmd[0].endswith(b"qemu-system-x86_64") and str(home).encode() in b" ".join(cmd):
                pids.append(int(d.name))
    return pids


def remove_stale_flat_dirs() -> None:
    """Stores that tests created and deleted leave their flat images on tmpfs: give that RAM back."""
    for d in stale_flat_dirs():
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def settings_env(monkeypatch):
    """settings_env(field=value, ...): this test runs with these forkd settings (forkd.base.settings field names,
    checked; the variables restored after it)."""
    from forkd.base.settings import Settings

    def _set(**fields: object) -> None:
        for field, value in fields.items():
            assert field in Settings.model_fields, f"no setting {field!r} (forkd.base.settings.Settings)"
            monkeypatch.setenv(env_name(field), "1" if value is True else "0" if value is False else str(value))
    return _set


@pytest.fixture
def unprimed(settings_env):
    """Children forked in this test run no default prime (FORKD_PRIME=0): for tests that count what a child wrote
    or ran since its fork, which the default prime (one `true` before the child is ready) adds to."""
    settings_env(prime=False)


@pytest.fixture
def awake(settings_env):
    """Idle children of this test are paged out but never stopped (FORKD_IDLE_SLEEP=0): for tests that watch an
    idle child's own CPU or clock."""
    settings_env(idle_sleep=False)


@pytest.fixture(scope="session")
def home():
    remove_stale_flat_dirs()
    d = Path(tempfile.mkdtemp(prefix="fkt", dir="/tmp"))
    seed_home(Layout(d))
    old = os.environ.get("FORKD_HOME")
    os.environ["FORKD_HOME"] = str(d)
    yield d
    Runtime(Layout(d)).kill(all_=True)
    leaked = qemu_pids(d)
    for pid in leaked:
        os.kill(pid, 9)
    shutil.rmtree(Layout(d).flat_cache.parent, ignore_errors=True)  # flat images on tmpfs
    shutil.rmtree(d, ignore_errors=True)
    remove_stale_flat_dirs()
    if old is None:
        os.environ.pop("FORKD_HOME", None)
    else:
        os.environ["FORKD_HOME"] = old
    assert not leaked, f"QEMU processes leaked past the test session: {leaked}"


@pytest.fixture(scope="session")
def rt(home) -> Runtime:
    return Runtime(Layout(home))


@pytest.fixture(scope="session")
def base(rt):
    """A warm snapshot: modules imported, a global set and a file written before the pause."""
    return rt.create_snapshot(ParentBuild.of(tag=BASE_TAG, memory_mib=512, warm_imports=("decimal", "random"),
                                              warm_exec=(f"WARM_GLOBAL = {WARM_GLOBAL!r}",),
                                              warm_run=("echo parent > /root/parent.txt",)))


@pytest.fixture
def fork(rt, base):
    """fork(n) -> records; every child forked through it is killed after the test."""
    made = []

    def _fork(n=1, tag=BASE_TAG):
        recs = rt.fork(Spawn.of(tag=tag, n=n))
        made.extend(recs)
        return recs

    yield _fork
    ids = [r.id for r in made if (rt.layout.children / r.id).exists()]
    if ids:
        rt.kill(ids)


def forkd_cli(*args: str, check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
    """Run the real `forkd` CLI (same interpreter) against the session's FORKD_HOME."""
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                         input=input, env=dict(os.environ), timeout=600)
    if check and res.returncode != 0:
        raise AssertionError(f"forkd {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
    return res


from tests.basetemp import pytest_sessionfinish, short_basetemp  # noqa: E402,F401 - short tmp_path (unix sockets)
from tests.branching import sfork, srt  # noqa: E402,F401 - fixtures: a runtime on tmpfs for BRANCH tests
from tests.fake_vmm import fake_base, fake_home, fake_rt  # noqa: E402,F401 - fixtures: the no-VM tier's fake-driver runtime
from tests.markers import (  # noqa: E402,F401 - hooks: the vm marker checked both ways
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_terminal_summary,
)
from tests.markers import pytest_configure as configure_markers  # noqa: E402
from tests.oci_images import layers, layout_dir  # noqa: E402,F401 - session fixtures: OCI test images
from tests.registries import registry_http, registry_layout, registry_tls  # noqa: E402,F401 - loopback registries
from tests.swap import swap  # noqa: E402,F401 - a module's swap device, for the tests that page children out


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    short_basetemp(config)
    configure_markers(config)
