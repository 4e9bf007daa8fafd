"""HTTP client -> the daemon's metrics (SECURITY.md section 6): a label takes only values the daemon owns. A client
that claims pools that do not exist, or pools that come and go, must not grow the series every scrape carries. The
real app (create_app) over a real Control and object store in a home of its own; no VMs (no pool here ever has a
snapshot: its claims fail, which is what is counted)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.spec.models import MODELS

POOL = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "real"},
        "spec": {"from": "nowhere", "warm": 0, "maxChildren": 2}}


@pytest.fixture
def api(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKD_HOME", str(tmp_path))
    control = Control(Runtime(Layout(tmp_path)))
    with TestClient(create_app(control)) as c:
        yield control, c


def samples(c: TestClient, name: str) -> list:
    out = []
    for fam in text_string_to_metric_families(c.get("/metrics").text):
        out += [s for s in fam.samples if s.name.startswith(name) and not s.name.endswith("_created")]
    return out


def test_claims_of_pools_that_do_not_exist_add_no_series(api):
    _, c = api
    before = len(samples(c, "forkd_claim"))
    for i in range(40):
        r = c.post(f"/v1/pools/no-such-pool-{i}/claim", json={"n": 1})
        assert r.status_code == 404, r.text
    found = samples(c, "forkd_claim")
    assert not [s for s in found if "no-such-pool" in s.labels.get("pool", "")]
    assert len(found) <= before + 1  # one counter series for every such claim together
    [failed] = [s for s in found if s.name == "forkd_claim_failures_total"]
    assert failed.labels == {"pool": "", "reason": "NotFound"} and failed.value == 40
    assert not [s for s in found if s.name.startswith("forkd_claim_seconds") and s.value]  # failures are not timed


def test_a_deleted_pools_series_go_with_it(api):
    control, c = api
    control.apply([(MODELS["ForkPool"].model_validate(POOL), "test")], "test-set")
    assert c.post("/v1/pools/real/claim", json={"n": 1}).status_code == 409  # a pool with no snapshot yet
    [failed] = [s for s in samples(c, "forkd_claim_failures_total")]
    assert failed.labels == {"pool": "real", "reason": "Conflict"} and failed.value == 1
    control.delete("ForkPool", "real")
    assert not [s for s in samples(c, "forkd_claim") if s.labels.get("pool") == "real"]
