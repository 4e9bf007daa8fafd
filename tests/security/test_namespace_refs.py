"""A tenant of one namespace -> another namespace's children and snapshots (SECURITY.md section 5).

Every reference a spec makes (a pool's or layer's `from`, a claim's `pool` and `from`, a branch's `sandbox`, by
`pool/<name>` or by raw child id) resolves inside the object's own namespace, `default` included. The attacks: a
ForkBranch naming another namespace's pool by its qualified name (`pool/team-b.agents`) or one of its children by
raw id (from `default`, into `default`, between two other namespaces; a child of a pool, of a claim `from` a branch,
one forked moments ago and not yet recorded, one forked by hand), and the same names reached through `from`,
`pool`, the snapshot tags long names are cut into, the YAML/apply path, the daemon API and the operator's handlers.
No VMs: the resolution is pure (forkd.reconciler.world) and the front ends refuse before anything is stored; the
runtime behind Control is a real one on an empty FORKD_HOME (no child, no image)."""

from __future__ import annotations

import logging
import re

import kopf
import pytest
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.errors import InvalidInput, NotFound
from forkd.base.names import NAME_PATTERN
from forkd.base.paths import Layout
from forkd.client.local import LocalBackend
from forkd.core.runtime import Runtime
from forkd.operator import handlers
from forkd.reconciler.actions import BuildBranch
from forkd.reconciler.control import Control
from forkd.reconciler.plan import plan
from forkd.reconciler.state import Actual, ChildState, ClaimRecord, Desired, SnapshotState
from forkd.reconciler.status import compute_status
from forkd.reconciler.world import parent_tag, resolve, tag_stem
from forkd.spec.loader import load_text
from forkd.spec.models import MODELS, ForkBranch
from forkd.spec.namespaces import NAMESPACE_PATTERN, qname, split_qname
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

NOW = 1_800_000_000.0


def obj(kind: str, name: str, ns: str = "default", **spec):
    return MODELS[kind](metadata={"name": name, "namespace": ns}, spec=spec)


def child(cid: str, pool: str | None, snapshot: str = "snap", claimed: bool = True) -> ChildState:
    return ChildState(id=cid, snapshot=snapshot, pool=pool, status="running", claimed=claimed,
                      claimed_at=NOW - 60 if claimed else None, created_at=NOW - 120)


# -- the world every branch below is resolved in --------------------------------------------------------------
# three namespaces with a pool "agents" each (one claimed child), team-b with a branch "src" whose snapshot a claim
# of team-b forked two children from: one its claim record holds, one forked moments ago (no record yet); a child
# team-b's claim holds whose snapshot is gone from the store; and a child forked by hand (the CLI's: "default")
SRC = obj("ForkBranch", "src", "team-b", sandbox="pool/agents")
SRC_TAG = resolve(Desired(branches=(SRC,)), Actual()).tags["team-b.src"]
CHILDREN = (child("c-def", "agents"), child("c-a", "team-a.agents"), child("c-b", "team-b.agents"),
            child("c-bclaim", None, SRC_TAG), child("c-bfresh", None, SRC_TAG), child("c-bheld", None, "gone"),
            child("c-hand", None, "manual"))
RECORDS = (ClaimRecord("team-b.hold", ("c-bclaim", "c-bheld"), NOW - 60),)
SNAPS = (SnapshotState(SRC_TAG, "ready", owner="ForkBranch/team-b.src"), SnapshotState("manual", "ready"))
POOLS = tuple(obj("ForkPool", "agents", ns, **{"from": "py"}) for ns in ("default", "team-a", "team-b"))


def branched(ns: str, sandbox: str) -> tuple[str | None, dict]:
    """(the child a ForkBranch "b" of `ns` naming `sandbox` would snapshot, or None; its conditions)."""
    b = obj("ForkBranch", "b", ns, sandbox=sandbox)
    d = Desired(pools=POOLS, branches=(b, SRC))
    a = Actual(snapshots=SNAPS, children=CHILDREN, claims=RECORDS, now=NOW)
    builds = [x for x in plan(d, a) if isinstance(x, BuildBranch) and x.branch == qname(ns, "b")]
    st = compute_status(d, a, previous={})[f"ForkBranch/{qname(ns, 'b')}"]
    return (builds[0].child if builds else None), {c.type: c for c in st.conditions}


ATTACKS = [
    ("default", "pool/team-b.agents"),  # a qualified name from default
    ("default", "c-b"),  # a raw id of another namespace's pool child
    ("default", "c-a"),
    ("default", "c-bclaim"),  # a raw id of a child a claim of team-b forked from its branch (no pool)
    ("default", "c-bfresh"),  # ... forked moments ago, its claim record not written yet
    ("default", "c-bheld"),  # ... whose snapshot is gone: its claim record says whose it is
    ("team-b", "c-def"),  # into default
    ("team-b", "c-hand"),  # a child forked by hand is the CLI's, the namespace default
    ("team-a", "c-b"),  # between two other namespaces
    ("team-a", "c-bclaim"),
    ("team-a", "pool/team-b.agents"),
    ("team-b", "pool/default.agents"),
]


@pytest.mark.parametrize(("ns", "sandbox"), ATTACKS)
def test_a_branch_never_snapshots_a_child_of_another_namespace(ns, sandbox):
    got, conds = branched(ns, sandbox)
    assert got is None
    deg = conds["Degraded"]
    assert deg.status == "True" and conds["Stalled"].status == "True" and conds["Ready"].status == "False"
    assert "spec.sandbox" in deg.message and f"namespace {ns}" in deg.message and sandbox in deg.message
    assert "team-" not in deg.message.replace(sandbox, "").replace(f"namespace {ns}", "")  # names no other's


@pytest.mark.parametrize("sandbox", ["pool/team-b.agents", "pool/default.agents", "pool/a/b", "team-b/c-b"])
def test_a_qualified_or_malformed_sandbox_is_refused_as_such(sandbox):
    _, conds = branched("default", sandbox)
    deg = conds["Degraded"]
    assert deg.reason == "ForeignReference", deg
    assert "pool/<name>" in deg.message  # what to write instead


@pytest.mark.parametrize(("ns", "sandbox", "want"), [
    ("default", "pool/agents", "c-def"), ("default", "c-def", "c-def"), ("default", "c-hand", "c-hand"),
    ("team-b", "pool/agents", "c-b"), ("team-b", "c-b", "c-b"), ("team-b", "c-bclaim", "c-bclaim"),
    ("team-b", "c-bfresh", "c-bfresh"), ("team-b", "c-bheld", "c-bheld"), ("team-a", "c-a", "c-a"),
    ("team-a", "pool/agents", "c-a"),
])
def test_a_branch_snapshots_its_own_namespace_s_children(ns, sandbox, want):
    assert branched(ns, sandbox)[0] == want


def test_refused_objects_resolve_the_same_in_any_order():
    """plan() is deterministic: the refused objects (and which of two of one name counts) do not depend on the
    order the store lists them in."""
    bad = [obj("ForkBranch", "b", ns, sandbox=f"pool/team-b.{p}") for ns in ("default", "team-a") for p in "xy"]
    a = Actual(children=CHILDREN, now=NOW)
    worlds = [resolve(Desired(branches=tuple(order)), a) for order in (bad, bad[::-1])]
    assert worlds[0] == worlds[1] and len(worlds[0].refused) == 2


def test_from_and_pool_references_resolve_in_the_object_s_own_namespace():
    """team-b has a parent "py", a branch "src" (ready), a layer "lay" and a pool "agents"; default has nothing of
    those names: default's layer, pool and claims naming them find nothing (and the other way round)."""
    b_parent, b_layer = obj("ForkParent", "py", "team-b"), obj("ForkLayer", "lay", "team-b", **{"from": "py"})
    b_pool = obj("ForkPool", "agents", "team-b", **{"from": "py"})
    mine = (obj("ForkLayer", "l1", **{"from": "py"}), obj("ForkLayer", "l2", **{"from": "src"}),
            obj("ForkPool", "p1", **{"from": "src"}), obj("ForkPool", "p2", **{"from": "lay"}),
            obj("ForkClaim", "k1", pool="agents"), obj("ForkClaim", "k2", pool="p1", **{"from": "src"}))
    d = Desired(parents=(b_parent,), layers=(b_layer, *mine[:2]), pools=(b_pool, *mine[2:4]), branches=(SRC,),
                claims=mine[4:])
    a = Actual(snapshots=SNAPS + (SnapshotState(parent_tag(resolve(d, Actual()).parents[0]), "ready"),),
               children=CHILDREN, claims=RECORDS, now=NOW)
    w = resolve(d, a)
    assert w.targets["p1"] is None and w.targets["p2"] is None and w.targets["team-b.agents"] is not None
    assert {f"{o.kind}/{o.metadata.name}" for o in mine} <= set(w.stuck)
    assert "l1" not in w.tags and "l2" not in w.tags and "team-b.lay" in w.tags
    assert not [x for x in plan(d, a) if getattr(x, "pool", None) in ("p1", "p2", "agents")]


@pytest.mark.parametrize(("ns", "name"), [("n" * 50, "agents"), ("n" * 43, "x" * 20), ("team-b", "x" * 52),
                                          ("a" * 63, "b" * 52)])
def test_a_long_qualified_name_never_cuts_into_a_name_another_namespace_can_take(ns, name):
    """A qualified name over 52 characters is cut into a shorter stem for its tags: that stem must be no name any
    namespace can take (a plain name of default, "ns.name" of a namespace that is the long one's prefix), or an
    object there with the same spec would stand for the very same snapshot."""
    stem = tag_stem(qname(ns, name))
    taker_ns, taker_name = split_qname(stem)
    assert not (re.match(NAME_PATTERN, taker_name) and re.match(NAMESPACE_PATTERN, taker_ns)), stem
    victim = obj("ForkParent", "py", ns)
    assert parent_tag(victim.model_copy(update={"metadata": victim.metadata.model_copy(
        update={"name": qname(ns, name)})})).startswith(stem)


# -- the front ends refuse before anything is stored ------------------------------------------------------------
BRANCH_YAML = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkBranch
metadata: {{name: steal, namespace: {ns}}}
spec: {{sandbox: {sandbox}}}
"""


@pytest.fixture
def control(tmp_path):
    c = Control(Runtime(Layout(tmp_path / "home")))
    yield c
    if c._reconciler is not None:
        c.reconciler.close()


@pytest.mark.parametrize(("ns", "sandbox"), [("default", "pool/team-b.agents"), ("team-a", "pool/team-b.agents"),
                                             ("default", "pool/x/y")])
def test_apply_refuses_a_reference_outside_the_namespace_and_stores_nothing(control, ns, sandbox):
    (loaded,), errors = load_text(BRANCH_YAML.format(ns=ns, sandbox=sandbox), "steal.yaml")
    assert errors == []
    ok = obj("ForkParent", "fine", ns)
    with pytest.raises(InvalidInput) as exc:
        control.apply([(ok, "ok.yaml"), (loaded.obj, "steal.yaml")], "set")
    msg = f"{exc.value.message} {exc.value.hint}"
    assert f"ForkBranch/steal in namespace {ns}" in msg and "spec.sandbox" in msg and "pool/<name>" in msg
    for kind in ("ForkParent", "ForkBranch"):
        assert control.get(kind) == []  # nothing applied, not even the valid object beside it


@pytest.mark.parametrize(("kind", "spec"), [
    ("ForkPool", "{from: team-b.py}"), ("ForkLayer", "{from: team-b.py}"), ("ForkClaim", "{pool: team-b.agents}"),
    ("ForkClaim", "{pool: agents, from: team-b.src}"),
])
def test_the_yaml_path_refuses_a_qualified_from_or_pool(kind, spec):
    text = f"apiVersion: forkd.dev/v1alpha1\nkind: {kind}\nmetadata: {{name: x}}\nspec: {spec}\n"
    loaded, errors = load_text(text, "x.yaml")
    assert loaded == [] and len(errors) == 1
    assert re.search(r"x\.yaml:4:.*spec\.(from|pool)", str(errors[0])), errors


def test_the_daemon_api_refuses_a_branch_naming_another_namespace_s_pool(control):
    api = TestClient(create_app(control))
    doc = {"metadata": {"name": "steal"}, "spec": {"sandbox": "pool/team-b.agents"}}
    r = api.post("/v1/branches", json=doc)
    assert r.status_code in (400, 422), r.text
    assert "spec.sandbox" in r.text and "namespace default" in r.text
    r = api.post("/v1/apply", json={"items": [{"document": {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkBranch",
                                                            "metadata": {"name": "steal", "namespace": "team-a"},
                                                            "spec": {"sandbox": "pool/team-b.agents"}}}],
                                    "applyset": "x"})
    assert r.status_code in (400, 422) and "namespace team-a" in r.text, r.text
    with pytest.raises(NotFound):
        control.get("ForkBranch", "steal")
    assert control.get("ForkBranch") == []


def _k8s(kind: str, ns: str, spec: dict) -> dict:
    return {"apiVersion": "forkd.dev/v1alpha1", "kind": kind,
            "metadata": {"name": "steal", "namespace": ns, "uid": "u-1", "generation": 1}, "spec": spec,
            "status": {}}


@pytest.mark.parametrize("ns", ["default", "team-a"])
def test_the_operator_refuses_a_branch_naming_another_namespace_s_pool(control, ns):
    """The kopf handler, called as kopf calls it, with the daemon behind it in-process (LocalBackend: the same
    apply, get and describe the RemoteBackend reaches over the socket)."""
    body = _k8s("ForkBranch", ns, {"sandbox": "pool/team-b.agents"})
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError, match="spec.sandbox"):
        handlers.reconcile(body=body, patch=patch, logger=logging.getLogger("t"), status={},
                           backend=LocalBackend(control), settle=0)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and f"namespace {ns}" in ready["message"]
    assert control.get("ForkBranch") == []


def test_the_operator_refuses_before_it_asks_any_daemon(monkeypatch, tmp_path):
    """Placement looks a branch's pool up on every node by the name it gives: a foreign name is refused first
    (permanently: InvalidSpec), not looked up, here with nodes whose daemons do not answer at all."""
    monkeypatch.setenv("FORKD_NODES", f"a={tmp_path}/a.sock,b={tmp_path}/b.sock")
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError, match="spec.sandbox"):
        handlers.reconcile(body=_k8s("ForkBranch", "default", {"sandbox": "pool/team-b.agents"}), patch=patch,
                           logger=logging.getLogger("t"), status={}, settle=0)
    assert next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")["reason"] == "InvalidSpec"


@pytest.mark.parametrize(("kind", "spec"), [("ForkClaim", {"pool": "team-b.agents"}),
                                            ("ForkPool", {"from": "team-b.src"}),
                                            ("ForkLayer", {"from": "team-b.py"})])
def test_the_operator_refuses_a_qualified_pool_or_from(control, kind, spec):
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        handlers.reconcile(body=_k8s(kind, "default", spec), patch=patch, logger=logging.getLogger("t"),
                           status={}, backend=LocalBackend(control), settle=0)
    assert control.get(kind) == []


def test_branch_model_still_takes_what_it_took():
    """A child id and pool/<name> stay valid sandboxes (the refusal is about namespaces, not the field's shape)."""
    for sandbox in ("c0123456789", "pool/agents"):
        assert ForkBranch(metadata={"name": "b"}, spec={"sandbox": sandbox}).spec.sandbox == sandbox


# -- end to end, on the fake VMM driver (the reconciler is logic above it) ------------------------------------------
def test_a_default_branch_of_team_b_s_claimed_child_is_refused_and_team_b_s_own_is_taken(rt):
    """team-b claims a real child of its pool; default's ForkBranch naming it by raw id stalls (SandboxNotFound)
    and writes no snapshot, one naming `pool/team-b.agents` is refused at apply; team-b's own branch of the same id
    is taken (the control that the id was branchable at all)."""
    control = Control(rt)
    team_b = [obj("ForkParent", "nsr", "team-b", memoryMiB=256),
              obj("ForkPool", "agents", "team-b", **{"from": "nsr", "warm": 1, "maxChildren": 2}),
              obj("ForkClaim", "hold", "team-b", pool="agents")]
    try:
        control.apply([(o, "vm.yaml") for o in team_b], "nsrefs-b")
        ok, problems = control.reconciler.run_until_converged(1200, [("ForkClaim", "team-b.hold")])
        assert ok, problems
        (held,) = control.get("ForkClaim", "team-b.hold")[0].status.children
        with pytest.raises(InvalidInput, match="spec.sandbox 'pool/team-b.agents'"):
            control.apply([(obj("ForkBranch", "steal-pool", sandbox="pool/team-b.agents"), "x.yaml")], "nsrefs-d")
        control.apply([(obj("ForkBranch", "steal", sandbox=held.id), "x.yaml"),
                       (obj("ForkBranch", "mine", "team-b", sandbox=held.id), "vm.yaml")], "nsrefs-x")
        ok, problems = control.reconciler.run_until_converged(900, [("ForkBranch", "team-b.mine")])
        assert ok, problems
        steal = control.get("ForkBranch", "steal")[0].status
        assert steal.condition("Degraded").reason == "SandboxNotFound" and steal.snapshot is None
        assert "namespace default" in steal.condition("Degraded").message
        made = {s.labels.get("forkd.dev/branch") for s in rt.store.list()}
        assert "team-b.mine" in made and "steal" not in made
        assert rt.child(held.id).status == "running"
    finally:
        for kind, name in (("ForkBranch", "steal"), ("ForkBranch", "team-b.mine"), ("ForkClaim", "team-b.hold"),
                           ("ForkPool", "team-b.agents"), ("ForkParent", "team-b.nsr")):
            try:
                control.delete(kind, name)
            except NotFound:
                pass
        control.reconciler.run_until_converged(300)
        left = [r.id for r in rt.children() if r.pool == "team-b.agents"]
        if left:
            rt.kill(left)
        control.reconciler.close()
