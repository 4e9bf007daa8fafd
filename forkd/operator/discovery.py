"""Which node daemons there are: FORKD_NODES if given (an explicit list), else the Ready pods of the DaemonSet that
FORKD_NODE_PODS names (NAMESPACE/LABEL-SELECTOR), else the one daemon on the local socket.

A pod is a node when it is Ready, not being deleted, and has an IP and a container port named `api`: the node is
its `spec.nodeName` and its daemon `http://POD-IP:PORT` (https with the annotation forkd.dev/api-scheme: https).
A node whose pod goes away (deleted, not Ready: the kubelet's verdict, or the node's) is simply absent from the
next answer; what it held is then placed again by the handlers (a pool's share elsewhere; a claim's children on it
reported lost). Each answer is kept for a second (every handler of a tick asks).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from forkd.base.errors import InvalidInput
from forkd.base.settings import settings

SCHEME_KEY = "forkd.dev/api-scheme"
PORT_NAME = "api"
TTL = 1.0
log = logging.getLogger("forkd.operator")

_lock = threading.Lock()
_cache: tuple[float, dict[str, str]] | None = None
_last: dict[str, str] = {}


def parse_nodes(raw: str) -> dict[str, str]:
    """FORKD_NODES: NAME=SOCKET|URL,... -> {name: endpoint}."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        name, _, endpoint = item.strip().partition("=")
        if not name or not endpoint:
            raise InvalidInput(f"FORKD_NODES entry {item!r}: use NAME=SOCKET or NAME=http://HOST:PORT")
        out[name] = endpoint
    return out


def parse_selector(raw: str) -> tuple[str, str]:
    """FORKD_NODE_PODS: NAMESPACE/SELECTOR -> (namespace, selector)."""
    namespace, _, selector = raw.strip().partition("/")
    if not namespace or not selector:
        raise InvalidInput(f"FORKD_NODE_PODS {raw!r}: use NAMESPACE/LABEL-SELECTOR, e.g. "
                           f"forkd-system/app.kubernetes.io/component=node-daemon")
    return namespace, selector


def pod_node(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(node name, daemon URL) of a node daemon's pod, or None while it is not one (see the module docstring)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return None
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return None
    port = next((p.get("containerPort") for c in spec.get("containers") or [] for p in c.get("ports") or []
                 if p.get("name") == PORT_NAME), None)
    if not isinstance(port, int):
        return None
    scheme = "https" if (meta.get("annotations") or {}).get(SCHEME_KEY) == "https" else "http"
    host = status["podIP"]
    host = f"[{host}]" if ":" in host else host
    return str(spec.get("nodeName") or meta.get("name")), f"{scheme}://{host}:{port}"


def from_pods(pods: list[Mapping[str, Any]]) -> dict[str, str]:
    """{node: URL} of the pods that are node daemons (the first pod of a node wins, by name)."""
    out: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        got = pod_node(pod)
        if got is not None and got[0] not in out:
            out[got[0]] = got[1]
    return out


def discovered(list_pods: Callable[[str, str], list[dict[str, Any]]] | None = None) -> dict[str, str]:
    """The node daemons FORKD_NODE_PODS finds now (cached for TTL seconds); joins and leaves are logged."""
    global _cache, _last
    namespace, selector = parse_selector(settings().node_pods)
    with _lock:
        if _cache is not None and time.monotonic() - _cache[0] < TTL:
            return dict(_cache[1])
    if list_pods is None:
        from forkd.operator.kube import kube

        list_pods = kube().pods
    found = from_pods(list_pods(namespace, selector))
    with _lock:
        for node in sorted(set(_last) - set(found)):
            log.warning("node %s left (no Ready node daemon pod): what it held is placed again", node)
        for node in sorted(set(found) - set(_last)):
            log.info("node %s joined: %s", node, found[node])
        _cache, _last = (time.monotonic(), found), found
    return dict(found)


def forget() -> None:
    """Drop the cached answer (tests; a changed FORKD_NODE_PODS)."""
    global _cache
    with _lock:
        _cache = None
