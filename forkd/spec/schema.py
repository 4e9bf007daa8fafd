"""JSON Schemas of the spec objects, for editors (`forkd schema`; a file says which with a modeline
`# yaml-language-server: $schema=...`), and `forkd explain KIND.field.path`. Pure: the schemas come from the models
(the same descriptions the CRDs carry); `inline_refs` is shared with forkd.operator.crdgen.

The editor schemas accept what `forkd apply` accepts: the fields an API server fills in (metadata.namespace, uid,
..., status) are allowed, as the loader ignores them; `forkd.json` takes a document of any kind (for files that
hold several).
"""

from __future__ import annotations

import copy
from typing import Any

from forkd.base.errors import InvalidInput, NotFound
from forkd.spec.models import API_VERSION, KINDS, MODELS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "https://forkd.dev/schemas/{name}.json"
ALL = "forkd"  # forkd.json: a document of any kind
# the loader drops these (forkd.spec.loader.SERVER_METADATA): an editor must not flag them
_SERVER_METADATA = ("namespace", "uid", "resourceVersion", "creationTimestamp", "managedFields", "finalizers",
                    "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences",
                    "generateName")


def inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every $ref (the models have no recursive types)."""
    if isinstance(node, list):
        return [inline_refs(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return inline_refs({**target, **rest}, defs)
    return {k: inline_refs(v, defs) for k, v in node.items() if k != "$defs"}


def resolved(kind: str) -> dict[str, Any]:
    """The model's JSON schema (validation mode, YAML field names) with every $ref inlined."""
    raw = MODELS[kind].model_json_schema(by_alias=True, mode="validation")
    return inline_refs(raw, raw.get("$defs", {}))


def kind_schema(kind: str) -> dict[str, Any]:
    """The editor schema of one kind."""
    schema = resolved(kind)
    meta = schema["properties"]["metadata"]
    for field in _SERVER_METADATA:
        meta["properties"].setdefault(field, {"description": "set by a Kubernetes API server; forkd ignores it"})
    schema["properties"]["status"] = {"description": "set by forkd; ignored by `forkd apply`"}
    return {"$schema": DRAFT, "$id": SCHEMA_ID.format(name=kind.lower()),
            "description": f"{kind} ({API_VERSION}): the object `forkd apply` and the CRD take", **schema}


def schemas() -> dict[str, dict[str, Any]]:
    """{file name: schema}: one per kind (forkpool.json, ...) and forkd.json for a document of any kind."""
    out = {f"{kind.lower()}.json": kind_schema(kind) for kind in KINDS}
    defs = {kind: {k: v for k, v in kind_schema(kind).items() if k not in ("$schema", "$id")} for kind in KINDS}
    out[f"{ALL}.json"] = {"$schema": DRAFT, "$id": SCHEMA_ID.format(name=ALL),
                          "description": f"any forkd object ({', '.join(KINDS)})", "$defs": defs,
                          "oneOf": [{"$ref": f"#/$defs/{kind}"} for kind in KINDS]}
    return out


# -- explain --------------------------------------------------------------------------------------------------
def _type(node: dict[str, Any]) -> str:
    if "anyOf" in node:
        return " | ".join(_type(b) for b in node["anyOf"] if b.get("type") != "null") or "any"
    if "enum" in node:
        return "enum: " + ", ".join(map(str, node["enum"]))
    if "const" in node:
        return f"{node['const']!r}"
    t = node.get("type", "object" if "properties" in node else "any")
    if t == "array":
        return f"[]{_type(node.get('items') or {})}"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    return str(t)


def _unwrap(node: dict[str, Any]) -> dict[str, Any]:
    """The object under an optional one (anyOf [X, null]) or a list of them."""
    if "anyOf" in node:
        objs = [b for b in node["anyOf"] if "properties" in b or b.get("type") == "array"]
        if len(objs) == 1:
            node = {**objs[0], "description": node.get("description", objs[0].get("description", ""))}
    if node.get("type") == "array" and isinstance(node.get("items"), dict) and "properties" in node["items"]:
        return {**node["items"], "description": node.get("description", "")}
    return node


def explain(path: str) -> dict[str, Any]:
    """`ForkPool.spec.child` -> {kind, path, type, description, required, fields: [{name, type, description,
    required, default}]}. Raises InvalidInput for an unknown kind, NotFound for an unknown field."""
    kind_word, *parts = path.split(".")
    kind = next((k for k in KINDS if k.lower() == kind_word.lower()), None)
    if kind is None:
        raise InvalidInput(f"unknown kind {kind_word!r}", hint=f"one of {', '.join(KINDS)}, e.g. ForkPool.spec")
    node, where, required = resolved(kind), kind, True
    for part in parts:
        props = _unwrap(node).get("properties") or {}
        if part not in props:
            known = ", ".join(props) or "none: it is a plain value"
            raise NotFound(f"{where} has no field {part!r}", hint=f"its fields: {known}")
        required = part in (_unwrap(node).get("required") or [])
        node, where = props[part], f"{where}.{part}"
    inner = _unwrap(node)
    fields = [{"name": name, "type": _type(sub), "description": sub.get("description", ""),
               "required": name in (inner.get("required") or []),
               **({"default": sub["default"]} if sub.get("default") not in (None, {}, []) else {})}
              for name, sub in (inner.get("properties") or {}).items()]
    return {"kind": kind, "path": where, "type": _type(node), "description": node.get("description", ""),
            "required": required, "fields": fields}
