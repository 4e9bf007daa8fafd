"""Placement never takes "the node did not answer" for "the node does not hold it": a pool whose holder cannot be
asked is not placed a second time elsewhere. One real daemon (no VM: placement asks it for objects and capacity);
the unreachable node is a loopback port nothing listens on."""

from __future__ import annotations

import pytest

from forkd.base.errors import Unavailable
from forkd.operator import handlers
from tests.test_api import free_port, start_api_daemon, stop_api_daemon
from tests.test_operator import call, resource


def test_an_unreachable_node_may_hold_the_pool_so_it_is_not_placed_again(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    d = start_api_daemon(home, tmp_path)
    try:
        monkeypatch.setenv("FORKD_TOKEN", d.token)
        monkeypatch.setenv("FORKD_RETRY_WAIT", "0.01")  # node a is still retried, without back-off
        pool = resource("ForkPool", "agents", {"from": "py", "warm": 1})
        down = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(Unavailable, match="node a did not answer whether it holds ForkPool/agents") as info:
            handlers.pool_shares(pool, {"a": down, "b": d.url}, "default")
        assert "FORKD_NODES" in info.value.hint
        assert handlers.pool_shares(pool, {"b": d.url}, "default") == {"b": 1}  # every node answered: placed
    finally:
        stop_api_daemon(d)


def test_a_held_share_is_found_in_any_namespace(tmp_path, monkeypatch):
    """The daemon keys objects by namespace and name: a pool the operator placed in namespace team-x is found as
    held (its share kept as the current one), not placed again from scratch."""
    home = tmp_path / "home"
    home.mkdir()
    d = start_api_daemon(home, tmp_path)
    try:
        monkeypatch.setenv("FORKD_TOKEN", d.token)
        pool = resource("ForkPool", "agents", {"from": "never-built", "warm": 3}, namespace="team-x")
        call(handlers.reconcile, pool, backend=handlers.daemon(d.url), settle=0)
        held = handlers.placement.holders({"b": d.url}, "ForkPool", "agents", "team-x")
        assert list(held) == ["b"] and held["b"].spec.warm == 3
        assert handlers.placement.holders({"b": d.url}, "ForkPool", "agents", "team-y") == {}
        call(handlers.release, pool, backend=handlers.daemon(d.url), wait=5)
    finally:
        stop_api_daemon(d)
