"""A ForkParent (or ForkLayer) is released from a node daemon only after the pools and layers there that fork from
it: deleted first, it would leave them Stalled (SourceNotFound), and a stalled pool scaled to zero never retires its
idle children, so the pool's own finalizer would wait for ever (`kubectl delete -f` of a parent and its pool
deletes both at once). One real node daemon over TCP (the fake VMM driver: no VM is needed, the pool is warm 0);
the handlers are called as kopf calls them (tests/test_operator.py's stand-in for the API server)."""

from __future__ import annotations

import secrets

import kopf
import pytest

from forkd.base.errors import NotFound
from forkd.operator import handlers
from forkd.spec.namespaces import qname
from tests.k8s.conftest import Node
from tests.test_operator import call, resource

NS = "team-r"
TOKEN = secrets.token_urlsafe(32)


def test_a_parent_is_released_after_the_pool_that_forks_from_it(monkeypatch):
    monkeypatch.setenv("FORKD_TOKEN", TOKEN)
    node = Node("r1", token=TOKEN, driver="fake")
    try:
        b = handlers.daemon(node.url)
        parent = resource("ForkParent", "rp-base", {"memoryMiB": 256}, namespace=NS)
        pool = resource("ForkPool", "rp-pool", {"from": "rp-base", "warm": 0}, namespace=NS)
        other = resource("ForkPool", "rp-other", {"from": "rp-base", "warm": 0}, namespace="team-s")  # not its user
        for body in (parent, pool, other):
            call(handlers.reconcile, body, backend=b, settle=0)
        with pytest.raises(kopf.TemporaryError, match=r"still the source of ForkPool/rp-pool on this node"):
            call(handlers.release, parent, backend=b)
        assert b.get("ForkParent", qname(NS, "rp-base"))  # still there
        call(handlers.release, pool, backend=b, wait=30)
        call(handlers.release, parent, backend=b)  # no user left in its namespace
        with pytest.raises(NotFound):
            b.get("ForkParent", qname(NS, "rp-base"))
        call(handlers.release, other, backend=b, wait=30)
    finally:
        node.stop()
