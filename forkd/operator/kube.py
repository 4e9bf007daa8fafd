"""The few Kubernetes API calls the operator makes itself (kopf does the watching): list the node daemons' pods,
write and delete a claim's Secret. Credentials come from kopf's own minimal login functions (the pod's service
account, else $KUBECONFIG / ~/.kube/config with a token, basic auth or a client certificate); exec plugins and
auth providers of a kubeconfig are not supported here.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
import threading
from typing import Any

import httpx
import kopf

from forkd.base.errors import Conflict, ForkdError, NotFound, Unavailable, first_line

_lock = threading.Lock()
_client: Kube | None = None


class Kube:
    """A synchronous client of one API server (httpx), from a kopf ConnectionInfo."""

    def __init__(self, info: Any) -> None:
        headers = {}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        auth = (info.username, info.password) if info.username and info.password else None
        verify: Any = True
        if info.insecure:
            verify = False
        elif info.ca_path or info.ca_data:
            verify = ssl.create_default_context(cafile=info.ca_path or None,
                                                cadata=_text(info.ca_data) if info.ca_data else None)
        cert = _cert(info)
        if cert and isinstance(verify, ssl.SSLContext):
            verify.load_cert_chain(*cert)
        self.http = httpx.Client(base_url=str(info.server).rstrip("/"), headers=headers, auth=auth, verify=verify,
                                 cert=cert if cert and not isinstance(verify, ssl.SSLContext) else None, timeout=30)

    def call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise Unavailable(f"Kubernetes API {method} {path}: {first_line(exc)}") from exc
        if r.status_code == 404:
            raise NotFound(f"Kubernetes API {method} {path}: not found")
        if r.status_code == 409:
            raise Conflict(f"Kubernetes API {method} {path}: {r.status_code} {r.text[:300]}")
        if r.status_code >= 300:
            raise ForkdError(f"Kubernetes API {method} {path}: {r.status_code} {r.text[:300]}",
                             hint="check the operator's RBAC (deploy/kubernetes/rbac.yaml)")
        return r.json() if r.content else {}

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})["items"]

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.call("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except NotFound:
            return None

    def put_secret(self, namespace: str, name: str, data: dict[str, str], owner: dict[str, Any],
                   labels: dict[str, str], create_first: bool = False) -> bool:
        """Create or replace the Secret when its data differ; True when written. `create_first`: the caller
        believes it does not exist yet, so it is created without a look first (one round trip on a new claim's
        path); when it does exist after all (409), it is read and replaced as usual."""
        enc = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        doc = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": enc,
               "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]}}
        if create_first:
            try:
                self.call("POST", f"/api/v1/namespaces/{namespace}/secrets", json=doc)
                return True
            except Conflict:
                pass
        cur = self.secret(namespace, name)
        if cur is not None and cur.get("data") == enc:
            return False
        if cur is None:
            self.call("POST", f"/api/v1/namespaces/{namespace}/secrets", json=doc)
        else:
            doc["metadata"]["resourceVersion"] = (cur.get("metadata") or {}).get("resourceVersion")
            self.call("PUT", f"/api/v1/namespaces/{namespace}/secrets/{name}", json=doc)
        return True

    def delete_secret(self, namespace: str, name: str) -> None:
        try:
            self.call("DELETE", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except NotFound:
            return


def _text(data: str | bytes) -> str:
    """kubeconfig's *-data fields are base64 of PEM; kopf passes them on as given."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        return base64.b64decode(raw, validate=True).decode()
    except ValueError:
        return raw.decode()


def _cert(info: Any) -> tuple[str, str] | None:
    if info.certificate_path and info.private_key_path:
        return str(info.certificate_path), str(info.private_key_path)
    if info.certificate_data and info.private_key_data:
        files = []
        for data in (info.certificate_data, info.private_key_data):
            f = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)  # noqa: SIM115 (kept for httpx)
            f.write(_text(data))
            f.close()
            files.append(f.name)
        return files[0], files[1]
    return None


def kube() -> Kube:
    """The operator's API client (one per process), logged in as kopf logs in without a client library."""
    global _client
    with _lock:
        if _client is None:
            settings = kopf.OperatorSettings()
            info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
            if info is None:
                raise Unavailable("no Kubernetes credentials: neither a service account nor a kubeconfig",
                                  hint="run in a pod with a service account, or set KUBECONFIG")
            _client = Kube(info)
        return _client
