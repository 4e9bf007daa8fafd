"""ForkClaim on the fake VMM driver (tests/fake_vmm.py): a claim object takes warm children of a pool through the
pool's claim path, lists them (ids, agent sockets) in its status, is Ready; its children answer; deleting the claim
kills them; a claim with a short ttl expires (Expired condition) and its children are retired. Plus the CLI's side:
`forkd get claims` with its AGE column, and the flags `apply` checks before it changes anything."""

from __future__ import annotations

import json

import pytest

from forkd.reconciler.control import Control
from forkd.spec.loader import load_text
from tests.conftest import forkd_cli
from tests.fake_vmm import on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: cp}
spec:
  memoryMiB: 256
  warmup: {exec: ["MARK = 'claimed'"]}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: cpool}
spec: {from: cp, warm: 2, maxChildren: 8}
"""


def claim_doc(name: str, count: int = 2, ttl: str | None = None, pool: str = "cpool") -> str:
    return (f"apiVersion: forkd.dev/v1alpha1\nkind: ForkClaim\nmetadata: {{name: {name}}}\n"
            f"spec: {{pool: {pool}, count: {count}{', ttl: ' + ttl if ttl else ''}}}\n")


def objs(text: str):
    loaded, errors = load_text(text, "test.yaml")
    assert not errors, errors
    return [(x.obj, f"{x.file}:{x.line}") for x in loaded]


@pytest.fixture(scope="module")
def control(rt):
    c = Control(rt)
    yield c
    for kind, name in (("ForkClaim", "c-ok"), ("ForkClaim", "c-short"), ("ForkClaim", "c-nopool"),
                       ("ForkClaim", "c-from"), ("ForkClaim", "c-src"), ("ForkBranch", "cbr"),
                       ("ForkPool", "cpool"), ("ForkParent", "cp")):
        try:
            c.delete(kind, name)
        except Exception:  # noqa: BLE001 - already gone
            pass
    c.reconciler.run_until_converged(60)
    left = [r.id for r in rt.children() if r.pool == "cpool"]
    if left:
        rt.kill(left)
    c.reconciler.close()


def converge(control, targets=None, timeout=600):
    ok, problems = control.reconciler.run_until_converged(timeout, targets)
    assert ok, problems


def cond(obj, type_: str) -> tuple[str, str]:
    c = obj.status.condition(type_)
    return (c.status, c.reason) if c else ("", "")


def test_claim_object_claims_lists_and_its_deletion_kills(rt, control):
    control.apply(objs(SPEC), "claims-test")
    converge(control)
    control.apply(objs(claim_doc("c-ok")), "claims-test-c")
    converge(control, [("ForkClaim", "c-ok")])
    claim = control.get("ForkClaim", "c-ok")[0]
    assert cond(claim, "Ready") == ("True", "Claimed") and cond(claim, "Expired")[0] == "False"
    assert cond(claim, "Stalled")[0] == "False" and claim.status.claimed == 2
    ids = [c.id for c in claim.status.children]
    assert len(set(ids)) == 2 and all(c.status == "running" and c.agentSocket for c in claim.status.children)
    recs = {r.id: r for r in rt.children()}
    assert all(recs[i].claimed and recs[i].pool == "cpool" for i in ids)
    assert rt.eval(ids[0], "MARK")["value"] == "'claimed'"  # reachable by the id the status gives
    # reapplying the same claim claims nothing more
    control.apply(objs(claim_doc("c-ok")), "claims-test-c")
    control.reconciler.step()
    assert [c.id for c in control.get("ForkClaim", "c-ok")[0].status.children] == ids
    # the pool refills its warm children meanwhile
    converge(control, [("ForkPool", "cpool")])
    assert control.get("ForkPool", "cpool")[0].status.claimed == 2
    control.delete("ForkClaim", "c-ok")
    assert not {r.id for r in rt.children()} & set(ids)  # killed at once
    assert control.objects.claims() == []


def test_claim_from_a_branch_forks_from_its_snapshot(rt, control):
    """`from` a ForkBranch: the children are forked from the branch's snapshot (children of no pool, only the claim
    retires them); deleting the claim kills them."""
    control.apply(objs(SPEC), "claims-test")  # (already there when the module runs in order)
    converge(control)
    control.apply(objs(claim_doc("c-src", count=1)), "claims-test-b")
    converge(control, [("ForkClaim", "c-src")])
    [src] = [c.id for c in control.get("ForkClaim", "c-src")[0].status.children]
    rt.eval(src, "globals().__setitem__('SEEN', 'in the branch')")
    branch = ("apiVersion: forkd.dev/v1alpha1\nkind: ForkBranch\nmetadata: {name: cbr}\n"
              f"spec: {{sandbox: {src}, mode: full}}\n")
    control.apply(objs(branch), "claims-test-b2")
    converge(control, [("ForkBranch", "cbr")])
    tag = control.get("ForkBranch", "cbr")[0].status.snapshot
    control.apply(objs(claim_doc("c-from", count=1).replace("count: 1", "count: 1, from: cbr")), "claims-test-b3")
    converge(control, [("ForkClaim", "c-from")])
    [child] = control.get("ForkClaim", "c-from")[0].status.children
    assert child.snapshot == tag and rt.child(child.id).pool is None and rt.child(child.id).claimed
    assert rt.eval(child.id, "SEEN")["value"] == "'in the branch'"
    control.delete("ForkClaim", "c-from")
    assert child.id not in {r.id for r in rt.children()}
    for kind, name in (("ForkClaim", "c-src"), ("ForkBranch", "cbr")):
        control.delete(kind, name)
    control.reconciler.step()


def test_claim_with_a_ttl_expires_and_its_children_go(rt, control):
    control.apply(objs(claim_doc("c-short", count=1, ttl="2s")), "claims-test-s")
    ok, problems = control.reconciler.run_until_converged(240, [("ForkClaim", "c-short")])
    claim = control.get("ForkClaim", "c-short")[0]
    if not ok:  # it may have expired before a pass saw it Ready
        assert cond(claim, "Expired")[0] == "True", problems
    ids = [c.id for c in claim.status.children]
    assert len(ids) == 1
    for _ in range(200):
        control.reconciler.step()
        claim = control.get("ForkClaim", "c-short")[0]
        if cond(claim, "Expired")[0] == "True" and not {r.id for r in rt.children()} & set(ids):
            break
        control.reconciler.wake.wait(0.25)
    assert cond(claim, "Expired") == ("True", "Expired") and cond(claim, "Ready") == ("False", "Expired")
    assert not {r.id for r in rt.children()} & set(ids)
    control.delete("ForkClaim", "c-short")


def test_claim_of_a_missing_pool_stalls_with_a_warning_event(control):
    control.apply(objs(claim_doc("c-nopool", pool="nope")), "claims-test-n")
    ok, problems = control.reconciler.run_until_converged(30, [("ForkClaim", "c-nopool")])
    assert not ok and any("PoolNotFound" in p for p in problems)
    claim = control.get("ForkClaim", "c-nopool")[0]
    assert cond(claim, "Stalled") == ("True", "PoolNotFound")
    events = control.objects.events("ForkClaim", "c-nopool")
    assert [(e["type"], e["reason"]) for e in events if e["type"] == "Warning"] == [("Warning", "PoolNotFound")]
    control.reconciler.step()  # no second event while the reason stays
    assert len([e for e in control.objects.events("ForkClaim", "c-nopool") if e["type"] == "Warning"]) == 1
    control.delete("ForkClaim", "c-nopool")


# -- the CLI ------------------------------------------------------------------------------------------------------
def test_apply_checks_flags_before_applying_and_warns_without_a_daemon(tmp_path, control):
    f = tmp_path / "claim.yaml"
    f.write_text(claim_doc("c-cli", pool="nope"))
    res = forkd_cli("apply", "-f", str(f), "--wait", "--timeout", "abc")
    assert res.returncode == 2 and "abc" in res.stderr
    with pytest.raises(Exception, match="not found"):
        control.get("ForkClaim", "c-cli")  # nothing applied
    res = forkd_cli("apply", "-f", str(f))
    assert res.returncode == 0, res.stderr
    assert "no forkd daemon answers" in res.stderr and "forkd serve" in res.stderr and "--wait" in res.stderr
    res = forkd_cli("get", "claims")
    assert res.returncode == 0, res.stderr
    header, row = res.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "POOL", "CLAIMED", "EXPIRES", "GEN", "AGE"]
    assert row.split()[0] == "c-cli" and row.split()[-1].rstrip("s").isdigit()
    doc = json.loads(forkd_cli("get", "claim/c-cli", "-o", "json", check=True).stdout)
    assert doc["metadata"]["creationTimestamp"].endswith("Z")
    # what `get -o yaml` prints goes back through `apply -f -` (server-populated fields ignored)
    res = forkd_cli("apply", "-f", "-", input=forkd_cli("get", "claim/c-cli", "-o", "yaml", check=True).stdout)
    assert res.returncode == 0 and "ForkClaim/c-cli" in res.stdout, res.stderr
    forkd_cli("delete", "claim/c-cli", check=True)
