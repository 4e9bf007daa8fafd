"""Namespaces on the fake VMM driver (tests/fake_vmm.py; the reconciler and CLI are logic above it): the same names
in two namespaces (a ForkParent and a ForkPool with warm 1 each) applied with `forkd apply -n`, reconciled without
collision (two snapshots, two pools of one child each); `forkd get -A` lists both with a NAMESPACE column, `-n` one;
a claim takes a child of its own namespace's pool; deleting the pool of one namespace leaves the other's pool and
child alone."""

from __future__ import annotations

import json

import pytest

from forkd.reconciler.control import Control
from tests.conftest import forkd_cli
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: nsp}
spec:
  memoryMiB: 256
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: nspool}
spec: {from: nsp, warm: 1, maxChildren: 4}
"""
NAMESPACES = ("team-a", "team-b")


@pytest.fixture(scope="module")
def control(rt):
    c = Control(rt)
    yield c
    for ns in NAMESPACES:
        for ref in ("pool/nspool", "parent/nsp"):
            forkd_cli("delete", ref, "-n", ns)
    c.reconciler.run_until_converged(120)
    left = [r.id for r in rt.children() if r.pool in {f"{ns}.nspool" for ns in NAMESPACES}]
    if left:
        rt.kill(left)
    c.reconciler.close()


def converge(control, timeout=900):
    ok, problems = control.reconciler.run_until_converged(timeout)
    assert ok, problems


def pool_children(rt, ns: str) -> list:
    return [r for r in rt.children() if r.pool == f"{ns}.nspool" and r.status == "running"]


def test_same_names_in_two_namespaces_do_not_collide(rt, control, tmp_path):
    spec = tmp_path / "ns.yaml"
    spec.write_text(SPEC)
    for ns in NAMESPACES:
        res = forkd_cli("apply", "-f", str(spec), "-n", ns, check=True)
        assert f"ForkPool/{ns}/nspool created" in res.stdout
    # a document naming another namespace than -n is refused, and nothing is applied
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("{name: nspool}", "{name: nspool2, namespace: team-c}"))
    res = forkd_cli("apply", "-f", str(other), "-n", "team-a")
    assert res.returncode == 2 and "team-c" in res.stderr
    converge(control)

    snaps = {ns: control.get("ForkParent", f"{ns}.nsp")[0].status.snapshot for ns in NAMESPACES}
    assert snaps["team-a"].startswith("team-a.nsp-") and snaps["team-b"].startswith("team-b.nsp-")
    for ns in NAMESPACES:
        pool = control.get("ForkPool", f"{ns}.nspool")[0]
        assert (pool.metadata.namespace, pool.status.warm) == (ns, 1)
        kids = pool_children(rt, ns)
        assert len(kids) == 1 and kids[0].snapshot == snaps[ns]

    # get: -A lists both with their namespace, -n one, the default namespace neither
    listed = json.loads(forkd_cli("get", "pools", "-A", "-o", "json", check=True).stdout)["items"]
    assert sorted((d["metadata"]["namespace"], d["metadata"]["name"]) for d in listed
                  if d["metadata"]["name"] == "nspool") == [("team-a", "nspool"), ("team-b", "nspool")]
    table = forkd_cli("get", "pools", "-A", check=True).stdout
    assert "NAMESPACE" in table and "team-a" in table and "team-b" in table
    only_b = json.loads(forkd_cli("get", "pools", "-n", "team-b", "-o", "json", check=True).stdout)["items"]
    assert [d["metadata"]["namespace"] for d in only_b] == ["team-b"]
    assert "nspool" not in forkd_cli("get", "pools", check=True).stdout
    described = forkd_cli("describe", "pool/nspool", "-n", "team-a", check=True).stdout
    assert pool_children(rt, "team-a")[0].id in described

    # a claim takes a child of its own namespace's pool
    res = json.loads(forkd_cli("claim", "nspool", "-n", "team-b", "-o", "json", check=True).stdout)
    (child,) = res["children"]
    assert rt.registry.get(child["id"]).pool == "team-b.nspool"
    rt.kill([child["id"]])

    # deleting team-a's pool retires its child and leaves team-b's pool and child alone
    forkd_cli("delete", "pool/nspool", "-n", "team-a", check=True)
    converge(control)
    assert pool_children(rt, "team-a") == []
    assert len(pool_children(rt, "team-b")) == 1
    assert control.get("ForkPool", "team-b.nspool")[0].status.warm == 1
    assert forkd_cli("get", "pool/nspool", "-n", "team-a").returncode != 0
