"""Concurrent claims against one pool through a real daemon (issue 15, finding 9), with real VMs.

Eight threads at a time do `Sandbox.create(pool="agents")` (the README's pool: warm 4, maxChildren 16), run a
command and kill their sandbox, while the pool is scaled down and up again (the reconcile loop retires idle
children meanwhile). Every claim must succeed with a child that answers as itself: a child forked on the spot for
a claim is claimed from birth, and nothing retires or removes a child another operation is still creating.
"""

from __future__ import annotations

import threading
import time

import pytest

from forkd.sdk import Sandbox
from tests.conftest import forkd_cli
from tests.test_api import start_api_daemon, stop_api_daemon

pytestmark = pytest.mark.vm

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {{name: race-base}}
spec: {{memoryMiB: 256, vcpus: 1, warmup: {{imports: [json]}}}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: agents}}
spec: {{from: race-base, warm: {warm}, maxChildren: 16, child: {{network: none, ttlSeconds: 600}}}}
"""
CLAIMERS = 8
ROUNDS = 3


def apply(warm: int) -> None:
    """`forkd apply -f -`: through the daemon while one runs (it owns the home), in-process before."""
    forkd_cli("apply", "-f", "-", input=SPEC.format(warm=warm), check=True)


def pool_children(rt) -> list:
    return [r for r in rt.children() if r.pool == "agents"]


def wait_for(cond, timeout: float = 300, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def warm_idle(rt, n: int) -> bool:
    kids = pool_children(rt)
    idle = [r for r in kids if not r.claimed and r.status == "running"]
    return len(idle) == n and len(kids) == n


@pytest.fixture(scope="module")
def daemon(home, tmp_path_factory, rt):
    apply(4)  # the daemon's loop builds the parent and fills the pool
    d = start_api_daemon(home, tmp_path_factory.mktemp("claims"))
    try:
        wait_for(lambda: warm_idle(rt, 4), 600, "the pool at 4 warm")
        yield d
    finally:
        try:
            for ref in ("pool/agents", "parent/race-base"):
                forkd_cli("delete", ref, check=True)
            wait_for(lambda: not pool_children(rt), 120, "the pool's children retired")
        finally:
            stop_api_daemon(d)
            left = [r.id for r in pool_children(rt)]
            if left:
                rt.kill(left)


def claimer(sock: str, i: int, results: dict, errors: list) -> None:
    try:
        sb = Sandbox.create(pool="agents", socket=sock)
    except Exception as exc:  # noqa: BLE001 - collected and reported by the test
        errors.append(f"claim {i}: {exc!r}")
        return
    try:
        results[i] = (sb.id, sb.commands.run("hostname").stdout.strip())
    except Exception as exc:  # noqa: BLE001
        errors.append(f"exec on {sb.id} (claim {i}): {exc!r}")
    finally:
        try:
            sb.kill()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"kill {sb.id} (claim {i}): {exc!r}")


def test_concurrent_claims_creates_and_kills_against_one_pool(daemon, rt):
    for rnd in range(ROUNDS):
        results: dict[int, tuple[str, str]] = {}
        errors: list[str] = []
        threads = [threading.Thread(target=claimer, args=(daemon.sock, i, results, errors))
                   for i in range(CLAIMERS)]
        for t in threads:
            t.start()
        # meanwhile the pool is scaled down and up: the loop retires idle children while claims fork new ones
        apply(1)
        time.sleep(1.5)
        apply(4)
        for t in threads:
            t.join(600)
        assert not errors, f"round {rnd}: " + "; ".join(errors)
        assert sorted(results) == list(range(CLAIMERS))
        ids = [cid for cid, _ in results.values()]
        assert len(set(ids)) == CLAIMERS, f"a child was handed out twice: {ids}"
        assert all(cid == host for cid, host in results.values()), results  # each answered as itself
        assert not [r.id for r in pool_children(rt) if r.status == "failed"]
        wait_for(lambda: warm_idle(rt, 4), 300, f"the pool back at 4 warm after round {rnd}")
