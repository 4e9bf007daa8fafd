"""forkd.operator.discovery: which pods are node daemons, and where their API is (pure parts, table-tested; the
operator finding them through an API server is tests/k8s/test_operator_nodes.py)."""

from __future__ import annotations

import copy

import pytest

from forkd.base.errors import InvalidInput
from forkd.operator.discovery import from_pods, parse_nodes, parse_selector, pod_node

POD = {"metadata": {"name": "forkd-node-x1", "annotations": {}},
       "spec": {"nodeName": "worker-1", "containers": [{"name": "forkd", "ports": [
           {"name": "metrics", "containerPort": 9100}, {"name": "api", "containerPort": 8889}]}]},
       "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]}}


def _with(path: str, value):
    pod = copy.deepcopy(POD)
    *head, last = path.split(".")
    cur = pod
    for part in head:
        cur = cur[part]
    cur[last] = value
    return pod


CASES = [
    ("a Ready pod", POD, ("worker-1", "http://10.1.2.3:8889")),
    ("https by annotation", _with("metadata.annotations", {"forkd.dev/api-scheme": "https"}),
     ("worker-1", "https://10.1.2.3:8889")),
    ("IPv6", _with("status.podIP", "fd00::5"), ("worker-1", "http://[fd00::5]:8889")),
    ("not Ready", _with("status.conditions", [{"type": "Ready", "status": "False"}]), None),
    ("no conditions yet", _with("status.conditions", []), None),
    ("being deleted", _with("metadata.deletionTimestamp", "2026-01-01T00:00:00Z"), None),
    ("no IP yet", _with("status.podIP", ""), None),
    ("no api port", _with("spec.containers", [{"name": "forkd", "ports": [{"containerPort": 8889}]}]), None),
]


@pytest.mark.parametrize("what,pod,expected", CASES, ids=[c[0] for c in CASES])
def test_pod_node(what, pod, expected):
    assert pod_node(pod) == expected


def test_one_daemon_per_node():
    other = _with("metadata.name", "forkd-node-a0")
    other["status"]["podIP"] = "10.9.9.9"
    assert from_pods([POD, other]) == {"worker-1": "http://10.9.9.9:8889"}  # by pod name: stable


def test_settings_parsing():
    assert parse_nodes("a=/x.sock, b=http://h:1") == {"a": "/x.sock", "b": "http://h:1"}
    assert parse_selector("forkd-system/app=x,b=c") == ("forkd-system", "app=x,b=c")
    for bad in ("nons", "/sel", "ns/"):
        with pytest.raises(InvalidInput, match="FORKD_NODE_PODS"):
            parse_selector(bad)
    with pytest.raises(InvalidInput, match="FORKD_NODES"):
        parse_nodes("a")
