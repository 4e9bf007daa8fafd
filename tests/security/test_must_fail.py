"""Invariants an earlier mutation check could break without any test noticing: each test here fails with that
one-line bug in place (the bug is named in each docstring)."""

from __future__ import annotations

import base64
import os
from types import SimpleNamespace

import pytest

from forkd.api.auth import load_or_create_token
from forkd.base.errors import InvalidInput
from forkd.core.requests import Spawn
from forkd.sandbox.claims import Claim
from forkd.sandbox.supervisor import Supervisor
from tests.conftest import BASE_TAG


def test_a_short_token_file_is_refused(tmp_path):
    """Bug caught: the minimum token length check disabled (a 1-character token would guard the TCP API)."""
    for short in ("x", "a" * 15):
        path = tmp_path / f"t{len(short)}"
        path.write_text(short + "\n")
        os.chmod(path, 0o600)
        with pytest.raises(InvalidInput, match="shorter than 16"):
            load_or_create_token(path)
    ok = tmp_path / "ok"
    ok.write_text("b" * 16 + "\n")
    os.chmod(ok, 0o600)
    assert load_or_create_token(ok) == "b" * 16


class RecordingAgent:
    """The agent end of a restored child, recording what the host told it (the supervisor is what is tested)."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def call(self, op: str, args: dict, timeout: float | None = None) -> dict:
        self.calls.append((op, args))
        return {}


def test_each_child_is_sent_its_own_fresh_entropy():
    """Bug caught: the host sending all-zero (or the same) entropy to every forked child. Comparing the children's
    /dev/urandom proves nothing (their kernels' own states already differ), so this looks at what the host sends."""
    sent = []
    for cid in ("c0000000001", "c0000000002", "c0000000003"):
        agent = RecordingAgent()
        Supervisor._reseed(SimpleNamespace(agent=agent), SimpleNamespace(id=cid), 5.0)
        [(op, args)] = agent.calls
        assert op == "forked" and args["child_id"] == cid
        sent.append(base64.b64decode(args["entropy"]))
    assert all(len(e) >= 32 for e in sent)
    assert len(set(sent)) == len(sent)  # never the same bytes twice
    assert all(len(set(e)) > 8 for e in sent)  # not a constant fill (64 random bytes hold ~60 distinct values)


@pytest.mark.vm
def test_a_child_forked_for_a_claim_is_recorded_claimed(rt, base):
    """Bug caught: a child forked for a claim saved without `claimed_at` (a pool would count it warm and hand it
    out again). Checked on the record file itself, not through the claims log."""
    claim = Claim.now(600)
    [rec] = rt.fork(Spawn.of(tag=BASE_TAG, n=1), claim=claim)
    try:
        on_disk = rt.registry._read(rec.id)
        assert on_disk.claimed_at == claim.at and on_disk.expires_at == claim.expires_at
        assert rt.registry.get(rec.id).claimed
    finally:
        rt.kill([rec.id])
