"""CustomResourceDefinitions generated from the spec models: apiextensions.k8s.io/v1, group forkd.dev, version
v1alpha1, one namespaced CRD per kind with the status subresource and printer columns (Age on every kind); ForkPool
also has the /scale subresource (spec.warm is its replicas, status.selector its label selector), so `kubectl
scale`, an HPA or KEDA can drive it.

The openAPIV3Schema is the model's pydantic JSON schema made *structural* (what the API server demands):
`$ref`s inlined, `anyOf [X, null]` -> X with `nullable: true`, `const` -> a one-value `enum`, pydantic's numeric
`exclusiveMinimum` -> `minimum` + `exclusiveMinimum: true`, `additionalProperties` kept only where it is a map,
`title`s and null defaults dropped, `metadata` left to Kubernetes (`type: object`). Pure: no I/O here.
"""

from __future__ import annotations

from typing import Any

import yaml

from forkd.spec.models import API_VERSION, KINDS
from forkd.spec.schema import resolved

GROUP, VERSION = API_VERSION.split("/")
READY = '.status.conditions[?(@.type=="Ready")]'
CATEGORY = "forkd"
SHORT_NAMES = {"ForkParent": ["fparent"], "ForkLayer": ["flayer"], "ForkPool": ["fpool"], "ForkBranch": ["fbranch"],
               "ForkClaim": ["fclaim"]}
SCALE = {"ForkPool": {"specReplicasPath": ".spec.warm", "statusReplicasPath": ".status.replicas",
                      "labelSelectorPath": ".status.selector"}}

# kept from the pydantic schema (validation the API server understands); everything else is dropped
# (in this order in the output, for readable diffs)
_KEEP = ("type", "description", "nullable", "default", "enum", "format", "pattern", "minLength", "maxLength",
         "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
         "uniqueItems", "minProperties", "maxProperties", "required", "properties", "items", "additionalProperties",
         "x-kubernetes-preserve-unknown-fields")


def _col(name: str, type_: str, path: str, description: str = "", priority: int = 0) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if description:
        col["description"] = description
    if priority:
        col["priority"] = priority
    return col


_AGE = _col("Age", "date", ".metadata.creationTimestamp")
_READY = _col("Ready", "string", f"{READY}.status", "the Ready condition")
_REASON = _col("Reason", "string", f"{READY}.reason", "why (not) Ready", priority=1)
PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "ForkParent": [_READY, _col("Snapshot", "string", ".status.snapshot", "the ready snapshot's tag"),
                   _col("Memory", "integer", ".spec.memoryMiB", "guest memory in MiB", priority=1), _REASON, _AGE],
    "ForkLayer": [_READY, _col("From", "string", ".spec.from"), _col("Snapshot", "string", ".status.snapshot"),
                  _col("Depth", "integer", ".status.chainDepth", "snapshot chain depth"), _REASON, _AGE],
    "ForkPool": [_READY, _col("Warm", "integer", ".status.warm", "children restored and idle"),
                 _col("Target", "integer", ".status.target", "spec.warm the pool converges to"),
                 _col("Claimed", "integer", ".status.claimed", "children handed out"),
                 _col("Depth", "integer", ".status.chainDepth", "snapshot chain depth"),
                 _col("SpawnP50", "number", ".status.spawnP50Ms", "median spawn latency (ms)"),
                 _col("From", "string", ".spec.from", priority=1), _REASON, _AGE],
    "ForkBranch": [_READY, _col("Sandbox", "string", ".spec.sandbox"), _col("Mode", "string", ".spec.mode"),
                   _col("Snapshot", "string", ".status.snapshot"), _REASON, _AGE],
    "ForkClaim": [_READY, _col("Pool", "string", ".spec.pool"), _col("Count", "integer", ".spec.count"),
                  _col("Claimed", "integer", ".status.claimed", "claimed children still running"),
                  _col("Expires", "string", ".status.expiresAt", "when the children are released"), _REASON, _AGE],
}


def plural(kind: str) -> str:
    low = kind.lower()
    return low + ("es" if low.endswith(("ch", "sh", "s", "x")) else "s")


def crd_name(kind: str) -> str:
    return f"{plural(kind)}.{GROUP}"


def structural(node: dict[str, Any], in_status: bool = False) -> dict[str, Any]:
    """One pydantic (JSON Schema 2020-12) node -> a structural Kubernetes OpenAPI v3 node."""
    node = dict(node)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        branches = [b for b in any_of if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {any_of} structurally")
        merged = {**branches[0], **{k: v for k, v in node.items() if k != "default" or v is not None}}
        node = {**merged, "nullable": True} if len(branches) < len(any_of) else merged
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if isinstance(node.get("exclusiveMaximum"), int | float) and not isinstance(node["exclusiveMaximum"], bool):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if node.get("default", 0) is None or in_status:
        node.pop("default", None)
    if "enum" in node and "type" not in node:
        node["type"] = "string" if all(isinstance(v, str) for v in node["enum"]) else "integer"
    out: dict[str, Any] = {k: node[k] for k in _KEEP if k in node}
    if "properties" in out:
        out["type"] = "object"
        out["properties"] = {k: structural(v, in_status) for k, v in out["properties"].items()}
        out.pop("additionalProperties", None)  # `false` is not allowed; unknown fields are pruned anyway
    elif isinstance(out.get("additionalProperties"), dict):  # a map
        out["type"] = "object"
        out["additionalProperties"] = structural(out["additionalProperties"], in_status)
    else:
        out.pop("additionalProperties", None)
    if "items" in out:
        out["items"] = structural(out["items"], in_status)
    if "required" in out and not out["required"]:
        del out["required"]
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):  # any value, checked by forkd
        raise ValueError(f"schema node without a type: {node}")
    return {k: out[k] for k in _KEEP if k in out}


def _conditions_as_map(schema: dict[str, Any]) -> None:
    conds = schema.get("properties", {}).get("conditions")
    if conds is not None:  # Kubernetes convention: one entry per condition type, merged by type
        conds["x-kubernetes-list-type"] = "map"
        conds["x-kubernetes-list-map-keys"] = ["type"]


def open_api_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of `kind`'s CRD."""
    schema_ = resolved(kind)
    props = schema_["properties"]
    spec = structural(props["spec"])
    status = structural(props["status"], in_status=True)
    status.pop("nullable", None)  # the status subresource is an object or absent
    _conditions_as_map(status)
    spec_required = "spec" in schema_.get("required", [])
    schema: dict[str, Any] = {
        "type": "object",
        "description": f"{kind} ({API_VERSION}), the same object `forkd apply` takes; see forkd's README.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if spec_required:
        schema["required"] = ["spec"]
    else:  # an empty spec is fine: every field has a default
        spec["default"] = {}
    return schema


def crd(kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name(kind), "labels": {"app.kubernetes.io/name": "forkd",
                                                         "app.kubernetes.io/component": "crd"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural(kind), "singular": kind.lower(),
                      "shortNames": SHORT_NAMES[kind], "categories": [CATEGORY]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}, **({"scale": SCALE[kind]} if kind in SCALE else {})},
                "additionalPrinterColumns": PRINTER_COLUMNS[kind],
                "schema": {"openAPIV3Schema": open_api_schema(kind)},
            }],
        },
    }


def crds() -> dict[str, dict[str, Any]]:
    """{file name: CRD} for every kind, e.g. "forkpools.forkd.dev.yaml"."""
    return {f"{crd_name(kind)}.yaml": crd(kind) for kind in KINDS}


HEADER = "# Generated by `forkd crds -o crds` from forkd/spec/models.py: do not edit by hand.\n"


def render(doc: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)


def rendered() -> dict[str, str]:
    """{file name: YAML text} of every CRD, exactly as checked in under crds/."""
    return {name: render(doc) for name, doc in crds().items()}


def kustomization() -> str:
    """crds/kustomization.yaml: lets deploy/kubernetes (and GitOps tools) include the CRDs as one directory."""
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(crds())}
    return HEADER + yaml.safe_dump(doc, sort_keys=False)


def files() -> dict[str, str]:
    """Everything `forkd crds -o crds` writes: the CRDs and their kustomization.yaml."""
    return {**rendered(), "kustomization.yaml": kustomization()}
