"""One snapshot family: `/v1/snapshots` answers the typed view (forkd.service.listing.SnapshotView), which carries
every field of the snapshot's record and of upstream's SnapshotInfo; the previous release's `/v1/manifests` and
`/v1/build/*` are the very handlers mounted again, marked deprecated. No VM and no daemon: the route tables are
built over a Service on a home whose snapshot records are written by hand (the app is called in-process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from forkd_client import models

from forkd.api.app import create_app
from forkd.api.routes_snapshots import ALIASES, build_snapshot_router
from forkd.base.paths import Layout
from forkd.service import Service, wire
from forkd.service.listing import SnapshotView
from forkd.store import chain
from forkd.store.snapshot import MANIFEST, MEMORY, VMSTATE, Snapshot

SHA = "0" * 64
FORKD = str(Path(sys.executable).with_name("forkd"))


def _record(tag: str, **kw) -> Snapshot:
    base = dict(tag=tag, status="ready", created_at=1700000000.5, memory_mib=256, vcpus=1, accel="tcg",
                image_id="img", kernel_sha256=SHA, qemu_version="8.2", memory_bytes=4096, memory_stored_bytes=512,
                labels={"forkd.dev/branch-of": "c-src"}, warm_imports=("json",), memory_sha256=SHA)
    return Snapshot(**{**base, **kw})


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = Service.on(Layout(tmp_path_factory.mktemp("snap-urls")))
    for snap in (_record("base"), _record("layer", parent_tag="base", parent_content_hash=SHA, labels={})):
        d = s.rt.store.dir(snap.tag)
        d.mkdir(parents=True)
        (d / MANIFEST).write_text(json.dumps(snap.to_json()))
        for name in (MEMORY, VMSTATE, chain.PAGES_FILE, chain.DATA_FILE):  # present, as a ready record says
            (d / name).touch()
    for name in ("mangled", "Not_A_Tag"):  # unreadable; the second is not even named as a tag
        bad = s.rt.store.root / name
        bad.mkdir()
        (bad / MANIFEST).write_text("{not json")
    return s


@pytest.fixture(scope="module")
def client(service):
    with TestClient(create_app(service)) as c:
        yield c


def test_a_snapshot_view_carries_every_field_of_the_record_and_of_upstreams_info():
    """A field added to the record, or to upstream's SnapshotInfo, reaches every listing."""
    names = {f.name for f in fields(SnapshotView)}
    assert names == {f.name for f in fields(Snapshot)} | {"dir", "created_at_unix", "branched_from", "corrupt"}
    assert set(models.SnapshotInfo.model_fields) <= names


def test_the_view_is_upstreams_snapshot_info(service):
    """Upstream's SnapshotInfo read from the view equals the one made from the record (what `/v1/snapshots`
    answered before it answered views)."""
    snap = service.rt.store.get("base")
    view = service.snapshot("base")
    want = wire.snapshot_info(snap, str(service.rt.store.dir("base")))
    keys = set(wire.SnapshotInfo.model_fields)
    assert wire.SnapshotInfo.model_validate(view.to_json()).model_dump(include=keys) == want.model_dump(include=keys)
    assert view.branched_from == "c-src" and view.created_at_unix == 1700000000
    back = SnapshotView.from_json(dict(view.to_json(), field_from_the_future=1))
    assert back == view and back["tag"] == "base" and back.get("field_from_the_future") is None


def test_an_unreadable_record_is_listed_failed_and_named(client):
    got = {s["tag"]: s for s in client.get("/v1/snapshots").json()}
    assert set(got) == {"base", "layer", "mangled", "Not_A_Tag"}
    assert got["mangled"]["corrupt"] and got["mangled"]["status"] == "failed" and "unreadable" in got["mangled"][
        "error"]
    assert not got["base"]["corrupt"]


def test_the_old_urls_are_the_same_handlers_marked_deprecated(service):
    """The same handler (an old build URL's only waits by default: its clients expect the snapshot, not a job)."""
    routes = {(m, r.path): r for r in build_snapshot_router(service).routes for m in r.methods}
    paths = create_app(service).openapi()["paths"]
    for (method, old), native in ALIASES.items():
        endpoint = routes[(method, old)].endpoint
        assert getattr(endpoint, "__wrapped__", endpoint) is routes[native].endpoint, old
        wait = {p["name"]: p["schema"].get("default") for p in paths[old][method.lower()].get("parameters", [])}
        assert wait.get("wait", True) is True, f"{old} answers a job by default: its clients expect the snapshot"
        assert paths[old][method.lower()].get("deprecated") is True, old
        assert not paths[native[1]][native[0].lower()].get("deprecated"), native
    assert {p for p in paths if p.startswith(("/v1/manifests", "/v1/build/"))} == {old for _, old in ALIASES}


def test_old_and_new_urls_answer_alike(client):
    """The previous release's reads answer what the family answers (a superset of the old manifests)."""
    assert client.get("/v1/manifests").json() == client.get("/v1/snapshots").json()
    info = client.get("/v1/snapshots/base/info").json()
    assert client.get("/v1/manifests/base").json() == info
    assert info["depth"] == 0 and info["dependents"] == ["layer"] and info["warm_imports"] == ["json"]
    assert info["path"] == info["dir"] and info["children"] == []
    assert client.get("/v1/snapshots/layer").json()["parent_tag"] == "base"


def test_deleting_through_each_url(client, service):
    """DELETE answers 204 as upstream's daemon does; the `delete` call (and its old alias) names what went;
    409 names the layer that depends on it."""
    r = client.delete("/v1/snapshots/base")
    assert r.status_code == 409 and "layer" in r.json()["detail"]
    for tag in ("gone-1", "gone-2", "gone-3"):
        d = service.rt.store.dir(tag)
        d.mkdir()
        (d / MANIFEST).write_text(json.dumps(_record(tag, created_at=time.time()).to_json()))
    assert client.delete("/v1/snapshots/gone-1").status_code == 204
    assert client.post("/v1/snapshots/gone-2/delete").json() == {"deleted": ["gone-2"]}
    assert client.delete("/v1/manifests/gone-3").json() == {"deleted": ["gone-3"]}
    assert client.get("/v1/snapshots/gone-3").status_code == 404
    assert client.post("/v1/snapshots/gone-3/delete").status_code == 404


def test_the_cli_lists_the_views_and_names_a_corrupt_one(service):
    """`forkd snapshots` (in-process here) prints the views: the table names an unreadable record by its directory,
    and `-o json` is the views' JSON."""
    env = dict(os.environ, FORKD_HOME=str(service.rt.layout.home), FORKD_NO_DAEMON="1", COLUMNS="200")
    table = subprocess.run([FORKD, "snapshots"], env=env, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[1:] if line.strip()}
    assert rows == {"base": "ready", "layer": "ready", "mangled": "corrupt", "Not_A_Tag": "corrupt"}, table.stdout
    listed = json.loads(subprocess.run([FORKD, "snapshots", "-o", "json"], env=env, capture_output=True, text=True,
                                       timeout=120, check=True).stdout)
    assert {s["tag"]: s for s in listed}["base"] == service.snapshot("base").to_json()
