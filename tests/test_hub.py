"""The hub on the fake VMM driver (tests/fake_vmm.py; packs, the hub and the store are logic above it): push a layer
to a file:// hub, serve it with `forkd hub serve`, pull it over HTTP into an empty store and fork from it; corrupted
downloads, short downloads and unknown versions are refused with nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from forkd.base.errors import ForkdError, InvalidInput, NotFound
from forkd.base.paths import Layout
from forkd.core.hub import parse_ref, pull, push
from forkd.core.pack import PackError
from forkd.core.requests import LayerBuild, Spawn
from forkd.core.runtime import Runtime
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver


def cli(home: Path, *args: str, hub: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, FORKD_HOME=str(home))
    if hub:
        env["FORKD_HUB"] = hub
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def _nothing_left(rt2: Runtime) -> None:
    lay = rt2.layout
    assert os.listdir(lay.snapshots) == [] and os.listdir(lay.images) == [] and os.listdir(lay.tmp) == []


@pytest.fixture
def empty():
    d = Path(tempfile.mkdtemp(prefix="fkh", dir="/tmp"))
    rt2 = Runtime(Layout(d))
    yield rt2
    rt2.kill(all_=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def hubdir(rt, base, home, tmp_path_factory):
    rt.snapshot_diff(LayerBuild.of(tag="hb1", parent_tag=BASE_TAG, run=("echo from-the-hub > /root/h",)))
    d = tmp_path_factory.mktemp("hub")
    res = cli(home, "push", "--tag", "hb1", "acme/py@1.0", "-o", "json", hub=f"file://{d}")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["file"] == "acme/py/1.0.tar.zst"
    yield d
    try:
        rt.rmi("hb1", force=True)
    except ForkdError:
        pass


@pytest.fixture(scope="module")
def server(hubdir):
    """`forkd hub serve DIR --port 0` in a subprocess; yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "forkd.cli.main", "hub", "serve", str(hubdir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        url = line.split(" at ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_index_lists_the_push(hubdir, rt):
    idx = json.loads((hubdir / "registry.json").read_text())
    entry = idx["packs"]["acme/py"]["versions"]["1.0"]
    assert idx["packs"]["acme/py"]["latest"] == "1.0"
    assert entry["size"] == (hubdir / "acme/py/1.0.tar.zst").stat().st_size and len(entry["sha256"]) == 64
    with pytest.raises(ForkdError, match="already on the hub"):
        push(rt, "hb1", "acme/py@1.0", f"file://{hubdir}")


def test_pull_over_http_into_an_empty_store_then_fork(server, empty):
    res = cli(empty.layout.home, "pull", "acme/py", "-o", "json", hub=server)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["version"] == "1.0" and info["head"] == "hb1" and info["chain"] == [BASE_TAG, "hb1"]
    assert "downloading" in res.stderr and "(100%" in res.stderr
    assert os.listdir(empty.layout.tmp) == []
    (child,) = empty.fork(Spawn.of(tag="hb1", n=1))
    assert empty.exec(child.id, ["cat", "/root/h"])["stdout"] == "from-the-hub\n"
    again = pull(empty, "acme/py@1.0", server)  # idempotent
    assert again["installed"] == [] and os.listdir(empty.layout.tmp) == []


def test_a_corrupted_download_is_refused(hubdir, server, empty):
    pk = hubdir / "acme/py/1.0.tar.zst"
    orig = pk.read_bytes()
    try:
        with open(pk, "r+b") as f:
            f.seek(len(orig) // 2)
            f.write(bytes([orig[len(orig) // 2] ^ 0xFF]))
        with pytest.raises(PackError, match="does not match the sha256 in the hub index"):
            pull(empty, "acme/py@1.0", server)
        _nothing_left(empty)
        res = cli(empty.layout.home, "pull", "acme/py@1.0", hub=server)
        assert res.returncode != 0 and "sha256" in res.stderr
        _nothing_left(empty)
    finally:
        pk.write_bytes(orig)


def test_a_short_download_is_refused(hubdir, empty, tmp_path):
    """The index promises more bytes than arrive (an interrupted transfer): refused, nothing left."""
    copy = tmp_path / "hub"
    shutil.copytree(hubdir, copy)
    idx = json.loads((copy / "registry.json").read_text())
    idx["packs"]["acme/py"]["versions"]["1.0"]["size"] += 4096
    (copy / "registry.json").write_text(json.dumps(idx))
    with pytest.raises(PackError, match="bytes, the index says"):
        pull(empty, "acme/py@1.0", f"file://{copy}")
    _nothing_left(empty)


def test_missing_version_and_bad_names(server, empty, rt):
    res = cli(empty.layout.home, "pull", "acme/py@9.9", hub=server)
    assert res.returncode == 3 and "no version '9.9'" in res.stderr and "1.0" in res.stderr
    with pytest.raises(NotFound, match="no pack 'acme/nope'"):
        pull(empty, "acme/nope", server)
    for bad in ("../etc", "acme/../x", "/abs/x", "acme/py@../../x", "acme", "Acme/py"):
        with pytest.raises(InvalidInput):
            parse_ref(bad)
    with pytest.raises(InvalidInput, match="not supported"):
        push(rt, "hb1", "acme/py@2.0", server)
    _nothing_left(empty)
