"""What a call means is the service's, whichever door it came through: a template name (a ForkParent's) forks that
parent's ready snapshot in-process (LocalBackend), through `/v1/children` and through upstream's `/v1/sandboxes`
adapter alike, each answering the child's view. The home runs the fake VMM driver (tests/fake_vmm.py; logic above
the driver) and no reconcile loop (the parent's status is written by hand, as a reconciler that built it would)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.paths import Layout
from forkd.client.local import LocalBackend
from forkd.core.requests import Spawn
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.service.listing import ChildView
from forkd.spec.models import MODELS, ForkParentStatus
from tests.conftest import BASE_TAG

TEMPLATE = "doors-tpl"


@pytest.fixture(scope="module")
def doors(fake_home, fake_base):
    local = LocalBackend(Control(Runtime(Layout(fake_home))))
    objects = local.control.objects
    parent = MODELS["ForkParent"].model_validate({"kind": "ForkParent", "metadata": {"name": TEMPLATE}})
    objects.put(parent, None, "test")
    objects.set_status("ForkParent", TEMPLATE, ForkParentStatus(snapshot=BASE_TAG))
    with TestClient(create_app(local.service)) as http:
        yield local, http
    objects.delete("ForkParent", TEMPLATE)


def test_a_template_forks_its_parents_snapshot_through_every_door(doors):
    local, http = doors
    made = []
    try:
        (kid,) = local.fork(Spawn.of(tag=TEMPLATE, n=1))
        made.append(kid.id)
        assert type(kid) is ChildView and kid.snapshot == BASE_TAG
        native = http.post("/v1/children", json={"tag": TEMPLATE})
        assert native.status_code == 201, native.text
        made += [c["id"] for c in native.json()["children"]]
        assert [c["snapshot"] for c in native.json()["children"]] == [BASE_TAG]
        compat = http.post("/v1/sandboxes", json={"snapshot_tag": TEMPLATE})
        assert compat.status_code == 201, compat.text
        made += [sb["id"] for sb in compat.json()]
        assert [sb["snapshot_tag"] for sb in compat.json()] == [BASE_TAG]
        assert {c.id for c in local.children()} >= set(made) and local.child(made[-1]).snapshot == BASE_TAG
    finally:
        local.kill(made)


def test_processes_run_through_the_service_under_both_prefixes(doors):
    """The process routes call the service's processes (forkd.service.processes), under upstream's
    `/v1/sandboxes/{id}/` and the native `/v1/children/{id}/` alike."""
    import base64
    import json

    local, http = doors
    (kid,) = local.fork(Spawn.of(tag=BASE_TAG, n=1))
    try:
        for prefix in ("/v1/sandboxes", "/v1/children"):
            r = http.post(f"{prefix}/{kid.id}/processes", json={"argv": ["sh", "-c", "echo hi; exit 3"]})
            assert r.status_code == 200, r.text
            events = [json.loads(line) for line in r.text.splitlines() if line.strip()]
            out = b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == "stdout")
            assert (events[0]["type"], out, events[-1]["type"], events[-1]["exit_code"]) == (
                "start", b"hi\n", "exit", 3), events
    finally:
        local.kill([kid.id])
