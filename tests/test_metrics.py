"""Prometheus metrics as users expect them, scraped from a real daemon (`forkd serve`) after a reconciler refill, a
claim and an exec: every path observes its latency (through forkd.base.telemetry), names follow the conventions,
and no label grows a series per snapshot or child. The daemon runs the fake VMM driver (tests/fake_vmm.py)."""

from __future__ import annotations

import gc
import time
import weakref

from forkd.api.metrics import Metrics
from forkd.base import telemetry
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.scrape import families, value
from tests.test_api import start_api_daemon, stop_api_daemon

ALIASES = {"forkd_snapshots_total", "forkd_sandboxes_active"}  # upstream names kept as gauge aliases
BOUNDED_LABELS = {"pool", "status", "reason", "kind", "action", "mode", "method", "route", "le", "version",
                  "python", "api", "residency"}


def check_conventions(fams: dict) -> None:
    for name, fam in fams.items():
        if fam.type == "gauge":
            assert not name.endswith("_total") or name in ALIASES, name
        assert "bytes_stored" not in name, name
        for s in fam.samples:
            assert set(s.labels) <= BOUNDED_LABELS, (s.name, s.labels)  # no tag=, id=: cardinality stays bounded


# -- no VMs ---------------------------------------------------------------------------------------------
def test_telemetry_reaches_metrics_and_subscribers_are_weak():
    m = Metrics()
    telemetry.observe("claim", 0.2, pool="p1")
    telemetry.spawned([type("R", (), {"timings_ms": {"ready": 150.0}})()], pool="p1", claimed=False)
    telemetry.spawned([type("R", (), {"timings_ms": {"ready": 90.0}})()], pool=None, claimed=False)
    with telemetry.timed("exec", kind="exec"):
        pass
    telemetry.observe("unknown-event", 1.0)
    fams = families(m.render().decode())
    check_conventions(fams)
    assert value(fams, "forkd_claim_seconds_count", pool="p1") == 1
    assert value(fams, "forkd_spawn_seconds_count", pool="p1", reason="refill") == 1
    assert value(fams, "forkd_spawn_seconds_count", pool="", reason="direct") == 1
    assert value(fams, "forkd_exec_seconds_count", kind="exec") == 1

    class Broken:
        def observe(self, *a):
            raise RuntimeError("broken subscriber")
    b = Broken()
    telemetry.subscribe(b)
    telemetry.observe("claim", 0.1, pool="p1")  # a raising subscriber does not stop the others
    assert value(families(m.render().decode()), "forkd_claim_seconds_count", pool="p1") == 2
    refs = [weakref.ref(m), weakref.ref(b)]
    del b, m
    gc.collect()
    assert [r() for r in refs] == [None, None]  # the hook held neither (other tests' apps may still subscribe)


# -- a real daemon --------------------------------------------------------------------------------------
PARENT = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkParent", "metadata": {"name": "metp"},
          "spec": {"memoryMiB": 256}}
POOL = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "metpool"},
        "spec": {"from": "metp", "warm": 1, "maxChildren": 4}}


def wait_warm(c, n: int, claimed: int = 0, timeout: float = 600) -> None:
    """Until the pool's status shows `n` warm and `claimed` claimed children (a status written before a claim still
    shows the claimed child warm: waiting for warm alone could return before the refill)."""
    deadline = time.monotonic() + timeout

    def status() -> dict:
        return c.get("/v1/pools/metpool/status").json()

    while (st := status()).get("warm", 0) < n or st.get("claimed", 0) < claimed:
        assert time.monotonic() < deadline, st
        time.sleep(0.5)


def _refills_counted(c, n: int, timeout: float = 60) -> dict:
    """The metric families once `n` refill spawns are counted: a spawn is observed when its whole batch has
    answered, a moment after its child shows in the pool's status; a refill never counted fails here."""
    deadline = time.monotonic() + timeout
    while True:
        fams = families(c.get("/metrics").text)
        got = value(fams, "forkd_spawn_seconds_count", pool="metpool", reason="refill")
        if got >= n:
            return fams
        assert time.monotonic() < deadline, f"{got:.0f} refill spawns counted, not {n}"
        time.sleep(0.2)


def test_metrics_after_refill_claim_exec(home, fake_base, tmp_path):
    d = start_api_daemon(home, tmp_path)
    try:
        with d.tcp() as c:
            assert c.post("/v1/parents", json=PARENT).status_code == 201
            assert c.post("/v1/pools", json=POOL).status_code == 201
            wait_warm(c, 1)  # a refill by the reconciler: no API spawn involved
            r = c.post("/v1/pools/metpool/claim", json={"n": 1})
            assert r.status_code == 200, r.text
            [child] = r.json()["sandboxes"]
            assert c.post(f"/v1/sandboxes/{child['id']}/exec", json={"args": ["true"]}).json()["exit_code"] == 0
            wait_warm(c, 1, claimed=1)  # refilled after the claim
            fams = _refills_counted(c, 2)
            c.delete(f"/v1/sandboxes/{child['id']}")
            c.delete("/v1/pools/metpool")
            c.delete("/v1/parents/metp")
    finally:
        stop_api_daemon(d)
    check_conventions(fams)
    assert value(fams, "forkd_spawn_seconds_count", pool="metpool", reason="refill") >= 2
    assert value(fams, "forkd_claim_seconds_count", pool="metpool") >= 1
    assert value(fams, "forkd_exec_seconds_count", kind="exec") >= 1
    assert value(fams, "forkd_reconcile_seconds_count") >= 1
    assert value(fams, "forkd_reconcile_action_seconds_count", action="SpawnChildren", pool="metpool") >= 2
    assert value(fams, "forkd_reconcile_action_seconds_count", action="BuildParent", pool="") >= 1
    assert value(fams, "forkd_pool_children", pool="metpool", status="running") >= 2
    assert value(fams, "forkd_sandboxes", status="stopping") >= 0  # counted (a series), even when none
    assert value(fams, "forkd_snapshot_stored_bytes") > 0
    assert value(fams, "forkd_snapshot_chain_depth_count") >= 2
    assert value(fams, "forkd_snapshot_chain_depth_max") >= 0
    assert value(fams, "forkd_snapshots_total") == sum(s.value for s in fams["forkd_snapshots"].samples)
    assert value(fams, "forkd_sandboxes_active") == value(fams, "forkd_sandboxes", status="running")
    assert sum(value(fams, "forkd_sandboxes_residency", residency=r) for r in ("awake", "paged", "asleep")) == \
        value(fams, "forkd_sandboxes", status="running")  # every running child has one residency
