"""Strict request bodies against a real daemon on the fake VMM driver (tests/fake_vmm.py; request parsing is
logic above the driver): every request body rejects unknown fields with a 422 naming them; upstream's documented
fields are honoured or refused with a reason; GET /v1/sandboxes fills memory_limit_mib, netns and guest_addr from
the child record."""

from __future__ import annotations

import pytest

from forkd.client import wire
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("strict"))
    yield d
    stop_api_daemon(d)


def _unknown(resp, field: str) -> None:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    body = resp.json()
    assert field in body["detail"], body
    assert any(e["type"] == "extra_forbidden" and e["loc"][-1] == field for e in body["errors"]), body


def test_every_request_model_forbids_extra_fields():
    strict = [m for m in vars(wire).values() if isinstance(m, type) and issubclass(m, wire.Strict)
              and m is not wire.Strict]
    assert len(strict) >= 15
    for model in strict:
        assert model.model_config.get("extra") == "forbid", model


def test_unknown_fields_are_422_naming_them(daemon):
    with daemon.unix() as c:
        _unknown(c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "n": 1, "bogus_field": 1}), "bogus_field")
        _unknown(c.post("/v1/snapshots", json={"tag": "never-built", "warm_imprts": ["x"]}), "warm_imprts")
        _unknown(c.post("/v1/sandboxes/nope/exec", json={"args": ["true"], "timeout": 3}), "timeout")
        _unknown(c.post("/v1/children/kill", json={"ids": [], "every": True}), "every")
        _unknown(c.post("/v1/apply", json={"items": [], "applyset": "a", "prunee": True}), "prunee")
        assert "never-built" not in [s["tag"] for s in c.get("/v1/snapshots").json()]


def test_upstream_create_snapshot_fields_are_refused_with_a_reason_not_a_default_image(daemon):
    """Before: upstream's MCP create_snapshot body answered 201 after building the default image."""
    body = {"tag": "upstream-mcp", "kernel": "/boot/vmlinux", "rootfs": "/images/rootfs.ext4", "rw": True,
            "boot_wait_secs": 5, "tap": "tap0"}
    with daemon.unix() as c:
        r = c.post("/v1/snapshots", json=body)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        for word in ("kernel", "rootfs", "tap", "from-image"):
            assert word in detail, detail
        r = c.post("/v1/snapshots", json={"tag": "upstream-ro", "rw": False})
        assert r.status_code == 422 and "rw: false" in r.json()["detail"]
        assert not {"upstream-mcp", "upstream-ro"} & {s["tag"] for s in c.get("/v1/snapshots").json()}


def test_spawn_accepts_prewarm_and_live_fork_and_list_fills_record_fields(daemon):
    """Before: memory_limit_mib was never filled by GET /v1/sandboxes though the record has it."""
    with daemon.unix() as c:
        r = c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "n": 1, "memory_limit_mib": 700,
                                          "prewarm": True, "live_fork": True})
        assert r.status_code == 201, r.text
        sid = r.json()[0]["id"]
        try:
            (listed,) = [s for s in c.get("/v1/sandboxes").json() if s["id"] == sid]
            assert listed["memory_limit_mib"] == 700
            assert c.get(f"/v1/sandboxes/{sid}").json()["memory_limit_mib"] == 700
            assert listed["netns"] is None and listed["guest_addr"] is None  # the base has no NIC
            assert c.post(f"/v1/sandboxes/{sid}/ping").json()["pong"] is True  # prewarm: the guest answers
        finally:
            c.delete(f"/v1/sandboxes/{sid}")


def test_isolated_child_shows_its_guest_address(rt, fork):
    """An isolated child's record (netns set) lists its guest address, as upstream's API does."""
    (rec,) = fork(1)
    iso = rt.child(rec.id).with_(network="isolated", netns=f"forkd-{rec.id}")
    info = wire.sandbox_info(iso)
    assert info.netns == f"forkd-{rec.id}" and info.guest_addr == "10.42.0.2"
    from forkd.sandbox.netns import GUEST_ADDR

    assert wire.GUEST_ADDR == GUEST_ADDR
