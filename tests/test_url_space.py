"""One native URL space: `/v1/children` for children (forkd.api.routes_children) with upstream's `/v1/sandboxes`
a compatibility layer over the same handlers and service verbs, `/v1/{plural}` for the declarative kinds with
`/v1/objects/...` deprecated aliases, and the typed child listing (forkd.service.listing.ChildView) every door
answers. No VM and no daemon: the route tables are built over a Service on an empty home."""

from __future__ import annotations

from dataclasses import fields

import pytest

from forkd.api.app import call_routers, create_app
from forkd.api.guestio import GuestIO
from forkd.api.metrics import Metrics
from forkd.api.routes_children import COMPAT, NATIVE, OWN_CALLS, child_calls
from forkd.base.paths import Layout
from forkd.sandbox.registry import ChildRecord
from forkd.service import Service, wire
from forkd.service.listing import ChildView


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return Service.on(Layout(tmp_path_factory.mktemp("urls-home")))


def _record(**kw) -> ChildRecord:
    base = dict(id="c1", snapshot="base", created_at=1.5, dir="/x/c1", memory_mib=256, vcpus=1, accel="tcg")
    return ChildRecord(**{**base, **kw})


def test_a_child_view_carries_every_field_of_the_record():
    """A field added to the record reaches every listing (the view is the record plus what the host says)."""
    assert {f.name for f in fields(ChildView)} == {f.name for f in fields(ChildRecord)} | {
        "status", "vmm_stopped", "agent_socket"}


def test_a_view_from_a_newer_daemon_keeps_what_it_knows():
    view = wire.child_view(_record(labels={"team": "a"}, residency="paged", wakes=2))
    data = dict(view.to_json(), field_from_the_future=1)
    back = ChildView.from_json(data)
    assert back == view and back["residency"] == "paged" and back.get("wakes") == 2
    assert back.get("field_from_the_future") is None
    with pytest.raises(KeyError):
        back["field_from_the_future"]
    assert back.elsewhere().agent_socket is None and view.agent_socket == "/x/c1/agent.sock"


def test_upstreams_sandbox_info_is_made_from_the_view():
    """The compatibility layer answers the view as upstream's SandboxInfo: a record and its view agree."""
    rec = _record(network="isolated", netns="/run/netns/x", claimed_at=2.0, expires_at=9.0, labels={"k": "v"})
    assert wire.sandbox_info(wire.child_view(rec)) == wire.sandbox_info(rec)
    assert wire.sandbox_info(wire.child_view(rec)).claimed is True


def _routes(routers):
    return {(m, r.path): r.endpoint for router in routers for r in router.routes
            if hasattr(r, "methods") for m in r.methods}


def test_every_call_on_a_child_is_one_handler_under_both_prefixes(service):
    calls = call_routers(service, Metrics(service.control), GuestIO())
    compat, native = _routes(calls), _routes([child_calls(*calls)])
    want = {(m, NATIVE + p[len(COMPAT):]): fn for (m, p), fn in compat.items()
            if p.startswith(COMPAT) and p[len(COMPAT):].split("/")[0] not in OWN_CALLS}
    assert len(want) > 20  # exec, eval, ping, branch, files..., processes..., logs, ports...
    assert native == want  # the same function objects: one handler, two paths


def test_the_native_routes_and_their_aliases_in_the_api_document(service):
    """Every old alias is marked deprecated; the native child family has one child and its calls."""
    paths = create_app(service).openapi()["paths"]
    old = [(p, m) for p, ops in paths.items() if p.startswith("/v1/objects/") for m in ops]
    assert old and all(paths[p][m].get("deprecated") for p, m in old)
    assert {"get", "delete"} <= set(paths["/v1/children/{id}"])
    for call in ("exec", "eval", "ping", "branch", "logs", "processes", "files", "ports"):
        assert f"/v1/children/{{id}}/{call}" in paths, call
    for plural in ("parents", "layers", "pools", "branches", "claims"):
        assert "get" in paths[f"/v1/{plural}/{{name}}/describe"], plural


def test_the_rest_reference_is_generated_from_the_routes():
    """docs/rest.md is what `python -m forkd.api.reference` prints for these routes (regenerate it when they
    change)."""
    from pathlib import Path

    from forkd.api.reference import current

    page = (Path(__file__).resolve().parent.parent / "docs" / "rest.md").read_text()
    assert page == current(), "docs/rest.md is stale: python -m forkd.api.reference > docs/rest.md"
