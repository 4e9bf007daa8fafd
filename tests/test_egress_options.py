"""Egress as the front doors take it, without VMs (tests/security/test_egress_per_sandbox.py probes real children)."""

from __future__ import annotations

import pytest
import typer
from forkd_client.sandbox import egress_of

from forkd.cli.options import egress_from
from forkd.client import wire


def test_cli_egress_flags():
    assert egress_from(None) is None and egress_from(["internet"]) == "internet"
    assert egress_from(["10.0.0.0/8:5432", "192.0.2.7:80-90"]).allow == ("10.0.0.0/8:5432", "192.0.2.7/32:80-90")
    for bad, why in ((["internet", "10.0.0.0/8:1"], "stands alone"), (["bogus"], "not CIDR:port"),
                     (["fd00::/8:80"], "IPv6")):
        with pytest.raises(typer.BadParameter, match=why):
            egress_from(bad)


def test_rest_spawn_request_takes_egress_and_defaults_to_none():
    assert wire.SpawnRequest(snapshot_tag="t").egress == "none"
    assert wire.SpawnRequest(snapshot_tag="t", egress={"allow": ["10.1.2.3:80"]}).egress.allow == ("10.1.2.3/32:80",)
    assert wire.ForkRequest().egress is None  # a fork keeps its source's
    with pytest.raises(ValueError):
        wire.SpawnRequest(snapshot_tag="t", egress="open")


def test_sdk_egress_and_e2b_allow_internet_access():
    assert egress_of(None, None, None) is None  # the daemon's default: none
    assert egress_of(None, True, None) == "internet" and egress_of(None, False, None) == "none"
    assert egress_of({"allow": ["10.0.0.0/8:1"]}, None, None) == {"allow": ["10.0.0.0/8:1"]}
    with pytest.raises(ValueError, match="not both"):
        egress_of("internet", True, None)
    with pytest.raises(ValueError, match="pool's egress"):
        egress_of("internet", None, "agents")


def test_a_claim_takes_its_pools_egress_and_cannot_ask_for_another():
    """A claimed child is one of the pool's warm children, made with the pool's child.egress: a ForkClaim and the
    REST claim refuse an egress of their own, naming the field."""
    from pydantic import ValidationError

    from forkd.service.wire import ClaimRequest
    from forkd.spec.models import ForkClaimSpec

    assert ForkClaimSpec(pool="agents").pool == "agents" and ClaimRequest().model_dump() is not None
    for make in (lambda: ForkClaimSpec(pool="agents", egress="internet"), lambda: ClaimRequest(egress="internet")):
        with pytest.raises(ValidationError, match="egress"):
            make()
