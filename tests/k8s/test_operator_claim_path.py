"""A ForkClaim's path through the operator: Ready, with its children and Secret, in the one run of its create handler
(no timer tick needed), and one reconcile of a resource at a time.

The claim test runs the real operator process against the API server stand-in (kmock's KubernetesEmulator,
tests/k8s/apiserver.py: not a real API server) and one real node daemon over TCP whose VMs are the fake driver's
(forkd/vmm/fake.py: the real guest agent as host processes; it passes tests/test_driver_contract.py): what is
checked is the operator's handling of a claim, which is the same above any driver. The operator's timer is set an
hour apart, so whatever the claim's status shows came from its create handler.
"""

from __future__ import annotations

import secrets
import threading

import kopf
import pytest

from forkd.base.errors import NotFound, Unavailable
from forkd.client.backends import RemoteBackend
from forkd.operator import handlers, serial
from forkd.spec.models import MODELS
from forkd.spec.namespaces import qname
from tests.k8s.apiserver import GROUP, VERSION
from tests.k8s.conftest import Node, Operator, wait_for

NS = "team-c"
TOKEN = secrets.token_urlsafe(32)


def doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def ready(obj: dict | None) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in ((obj or {}).get("status") or {})
               .get("conditions") or [])


@pytest.fixture
def fake_node(monkeypatch):
    monkeypatch.setenv("FORKD_VMM_DRIVER", "fake")  # the daemon inherits it
    node = Node("c1", token=TOKEN)
    yield node
    node.stop()


def test_a_claim_is_ready_from_its_create_handler_alone(api, fake_node, workdir):
    """The daemon's first status of a new claim is still in progress (WaitingForPool / Claiming); the handler
    waits for the claimed one instead of copying that and leaving the claim pending until the next tick."""
    op = Operator(api, None, workdir, FORKD_NODES=f"c1={fake_node.url}", FORKD_TOKEN=TOKEN,
                  FORKD_OPERATOR_INTERVAL="3600").start()
    try:
        api.create("forkparents", doc("ForkParent", "cp-base", {"memoryMiB": 256}))
        api.create("forkpools", doc("ForkPool", "cp-pool", {"from": "cp-base", "warm": 1, "maxChildren": 3}))
        daemon = RemoteBackend(url=fake_node.url, token=TOKEN)

        def warm() -> bool:
            try:
                pool = daemon.get("ForkPool", qname(NS, "cp-pool"))[0]
            except NotFound:  # not applied yet
                return False
            return pool.status is not None and pool.status.warm >= 1

        wait_for("a warm child on the node", warm, timeout=300, log=op.log)
        api.create("forkclaims", doc("ForkClaim", "cp-claim", {"pool": "cp-pool", "count": 1, "ttl": "10m"}))
        claim = wait_for("the claim Ready with its child and Secret", lambda: (
            o := api.get("forkclaims", NS, "cp-claim")) and ready(o) and o["status"].get("tokenSecret")
            and len(o["status"].get("children") or []) == 1 and o, timeout=120, log=op.log)
        assert claim["status"]["children"][0]["endpoint"] == fake_node.url
        assert api.get("secrets", NS, claim["status"]["tokenSecret"]) is not None
        api.delete("forkclaims", NS, "cp-claim")
        wait_for("claim and Secret gone", lambda: api.get("forkclaims", NS, "cp-claim") is None
                 and api.get("secrets", NS, claim["status"]["tokenSecret"]) is None, timeout=120, log=op.log)
        for plural, name in (("forkpools", "cp-pool"), ("forkparents", "cp-base")):
            api.delete(plural, NS, name)
            wait_for(f"{name} gone", lambda p=plural, n=name: api.get(p, NS, n) is None, timeout=120, log=op.log)
    finally:
        op.stop()


def _daemon_obj(kind: str, generation: int, observed: int | None, reconciling: str | None) -> object:
    spec = {"ForkClaim": {"pool": "p", "count": 1}, "ForkPool": {"from": "b", "warm": 1}}[kind]
    doc = {"apiVersion": "forkd.dev/v1alpha1", "kind": kind, "metadata": {"name": "x", "generation": generation},
           "spec": spec}
    if observed is not None:
        doc["status"] = {"observedGeneration": observed, "conditions": [] if reconciling is None else [
            {"type": "Reconciling", "status": reconciling, "reason": "WaitingForPool"}]}
    return MODELS[kind].model_validate(doc)


@pytest.mark.parametrize("kind,generation,observed,reconciling,expect", [
    ("ForkClaim", 1, None, None, False),  # not reconciled yet
    ("ForkClaim", 2, 1, "False", False),  # an older generation's status
    ("ForkClaim", 1, 1, "True", False),  # WaitingForPool / Claiming: its children are a moment away
    ("ForkClaim", 1, 1, "False", True),  # claimed (or failed for good)
    ("ForkPool", 1, 1, "True", True),  # a pool warming takes minutes: its status is copied as it goes
], ids=["unreconciled", "old-generation", "claim-in-progress", "claim-done", "pool-warming"])
def test_which_daemon_status_the_handler_copies(kind, generation, observed, reconciling, expect):
    assert handlers.settled(_daemon_obj(kind, generation, observed, reconciling)) is expect


class Recorder:
    """A node daemon that records that it was asked and does not answer (the reconcile then fails)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    def get(self, *_: object) -> None:
        self.order.append("ran")
        raise Unavailable("this stand-in daemon never answers")


def _claim_body(uid: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ForkClaim",
            "metadata": {"name": "one", "namespace": NS, "uid": uid, "generation": 1},
            "spec": {"pool": "p", "count": 1}, "status": {}}


def test_a_timer_tick_is_skipped_while_the_resource_is_reconciled():
    """With the resource's reconcile in flight, its timer tick returns at once, asking no daemon; without, the
    tick reconciles."""
    body, order = _claim_body("uid-tick"), []
    with serial.held(body):
        handlers.on_tick(body=body, patch=kopf.Patch(), backend=Recorder(order))  # skipped: no error
    assert order == []
    with pytest.raises(kopf.TemporaryError):
        handlers.on_tick(body=body, patch=kopf.Patch(), backend=Recorder(order))
    assert order == ["ran"]
    serial.forget(body)


def test_a_change_handler_waits_for_the_reconcile_in_flight():
    body, order = _claim_body("uid-change"), []

    def change() -> None:
        with pytest.raises(kopf.TemporaryError):
            handlers.on_change(body=body, patch=kopf.Patch(), backend=Recorder(order))

    with serial.held(body):
        worker = threading.Thread(target=change)
        worker.start()
        worker.join(0.5)  # a chance to run; it must not while the lock is held
        order.append("released")
    worker.join(60)
    assert order == ["released", "ran"]
    serial.forget(body)
