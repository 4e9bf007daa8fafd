"""The CustomResourceDefinitions under crds/: generated from the spec models (and checked in up to date), valid
apiextensions.k8s.io/v1 with structural schemas, and every example in specs/examples validates against its CRD.

No Kubernetes API server can be installed on this machine. Each CRD is validated as a Kubernetes object by the
published `kubernetes-validate` (strict: tests/test_deploy.py::test_every_plain_manifest_validates); what that does
not check, "structural" (one type per node, no properties with additionalProperties, ...), is checked by the rules
the API server applies (a checker below), and "validates" with the `jsonschema` package on the schema converted back
from Kubernetes' OpenAPI dialect (nullable -> a null type; unknown fields rejected, as kubectl's strict field
validation does).
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from forkd.operator.crdgen import PRINTER_COLUMNS, crd_name, files, open_api_schema, plural
from forkd.spec.loader import collect_files, load_paths, load_values
from forkd.spec.models import KINDS, MODELS, ForkParentStatus, ForkPoolStatus

ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = ROOT / "crds"
EXAMPLES = ROOT / "specs" / "examples"

# JSONSchemaProps fields the API server knows (apiextensions.k8s.io/v1)
PROPS = {"type", "format", "title", "description", "default", "maximum", "exclusiveMaximum", "minimum",
         "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
         "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf", "oneOf", "anyOf",
         "not", "properties", "additionalProperties", "nullable", "example", "externalDocs",
         "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
         "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-validations"}
TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def checked_in() -> dict[str, dict]:
    """The CRDs under crds/ (not its kustomization.yaml)."""
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.forkd.dev.yaml"))}


def structural_problems(node, path: str = "") -> list[str]:
    """What makes `node` non-structural (or otherwise rejected by the API server); [] when fine."""
    out: list[str] = []
    if not isinstance(node, dict):
        return [f"{path}: not a schema object"]
    for key in node:
        if key not in PROPS:
            out.append(f"{path}: unknown or forbidden keyword {key!r}")
    exempt = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    type_ = node.get("type")
    if type_ is None and not exempt:
        out.append(f"{path}: no type")
    if type_ is not None and (not isinstance(type_, str) or type_ not in TYPES):
        out.append(f"{path}: type {type_!r} (one type, not a list; no 'null')")
    for key in ("nullable", "exclusiveMinimum", "exclusiveMaximum", "uniqueItems"):
        if key in node and not isinstance(node[key], bool):
            out.append(f"{path}: {key} must be a boolean")
    for key in ("anyOf", "oneOf", "allOf"):  # allowed only without types/defaults/nullable inside; we use none
        if key in node:
            out.append(f"{path}: {key} (the generator inlines/flattens everything)")
    if "properties" in node:
        if type_ != "object":
            out.append(f"{path}: properties under type {type_!r}")
        if "additionalProperties" in node:
            out.append(f"{path}: properties and additionalProperties together")
        for name, sub in node["properties"].items():
            out += structural_problems(sub, f"{path}.{name}")
        for name in node.get("required", []):
            if name not in node["properties"]:
                out.append(f"{path}: required {name!r} is not a property")
    elif "required" in node:
        out.append(f"{path}: required without properties")
    if "additionalProperties" in node:
        ap = node["additionalProperties"]
        if not isinstance(ap, dict):
            out.append(f"{path}: additionalProperties must be a schema (a map), not {ap!r}")
        else:
            if type_ != "object":
                out.append(f"{path}: additionalProperties under type {type_!r}")
            out += structural_problems(ap, f"{path}{{*}}")
    if "items" in node:
        if type_ != "array" or not isinstance(node["items"], dict):
            out.append(f"{path}: items must be one schema under type array")
        else:
            out += structural_problems(node["items"], f"{path}[*]")
    elif type_ == "array":
        out.append(f"{path}: array without items")
    if "enum" in node and type_ in TYPES:
        pytype = {"string": str, "integer": int, "number": (int, float), "boolean": bool}.get(type_)
        if pytype and not all(isinstance(v, pytype) for v in node["enum"]):
            out.append(f"{path}: enum values are not all {type_}")
    if node.get("x-kubernetes-list-type") == "map":
        item = node.get("items", {})
        for key in node.get("x-kubernetes-list-map-keys", []):
            if key not in item.get("required", []):
                out.append(f"{path}: list-map key {key!r} must be required in the items")
    return out


def to_json_schema(node, strict: bool = True):
    """Kubernetes OpenAPI v3 -> JSON Schema (draft 2020-12) for jsonschema: nullable becomes a null type,
    boolean exclusive bounds become numeric ones, x-kubernetes-* go, objects with properties forbid others."""
    if isinstance(node, list):
        return [to_json_schema(x, strict) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v, strict) if k in ("items", "additionalProperties") else v
           for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("nullable", "properties")}
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v, strict) for k, v in node["properties"].items()}
        if strict:
            out["additionalProperties"] = False
    for bound, key in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if out.get(key) is True:
            out[key] = out.pop(bound)
        elif out.get(key) is False:
            del out[key]
    if node.get("nullable"):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def schema_of(kind: str) -> dict:
    doc = checked_in()[f"{crd_name(kind)}.yaml"]
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validator(kind: str) -> jsonschema.protocols.Validator:
    schema = to_json_schema(schema_of(kind))
    schema["properties"]["metadata"] = {"type": "object"}  # Kubernetes' own: names, labels, annotations...
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# -- generated and up to date -------------------------------------------------------------------------------
def test_checked_in_crds_match_the_models():
    want = files()
    have = {p.name: p.read_text() for p in sorted(CRD_DIR.glob("*.yaml"))}
    stale = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    assert not stale, (f"crds/ is out of date with forkd/spec/models.py ({', '.join(stale)}): "
                       "run `forkd crds --output-dir crds`")


def test_forkd_crds_command_writes_the_same_files(tmp_path):
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "crds", "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.yaml")}
    assert got == {p.name: p.read_text() for p in CRD_DIR.glob("*.yaml")}
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "crds"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert [d["spec"]["names"]["kind"] for d in yaml.safe_load_all(res.stdout)] == list(KINDS)


# -- valid CRDs ---------------------------------------------------------------------------------------------
def test_one_namespaced_crd_per_kind_with_status_and_columns():
    docs = checked_in()
    assert sorted(d["spec"]["names"]["kind"] for d in docs.values()) == sorted(KINDS)
    kustomization = yaml.safe_load((CRD_DIR / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(docs)
    assert sorted(p.name for p in CRD_DIR.iterdir()) == sorted([*docs, "kustomization.yaml"])
    for fname, d in docs.items():
        kind = d["spec"]["names"]["kind"]
        assert fname == f"{d['metadata']['name']}.yaml"
        assert d["apiVersion"] == "apiextensions.k8s.io/v1" and d["kind"] == "CustomResourceDefinition"
        spec = d["spec"]
        assert spec["group"] == "forkd.dev" and spec["scope"] == "Namespaced"
        assert d["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
        assert spec["names"]["plural"] == plural(kind) and spec["names"]["singular"] == kind.lower()
        assert spec["names"]["listKind"] == f"{kind}List"
        [version] = spec["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        scale = {"scale": {"specReplicasPath": ".spec.warm", "statusReplicasPath": ".status.replicas",
                           "labelSelectorPath": ".status.selector"}} if kind == "ForkPool" else {}
        assert version["subresources"] == {"status": {}, **scale}
        schema = version["schema"]["openAPIV3Schema"]
        for path in scale.get("scale", {}).values():  # the /scale paths name fields of the schema
            assert _column_resolves(schema, path), path
        cols = {c["name"]: c for c in version["additionalPrinterColumns"]}
        assert cols["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
        assert cols["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        for c in cols.values():
            assert c["type"] in ("integer", "number", "string", "boolean", "date")
            assert _column_resolves(version["schema"]["openAPIV3Schema"], c["jsonPath"]), c
        assert list(cols) == [c["name"] for c in PRINTER_COLUMNS[kind]]
    pool = {c["name"]: c["jsonPath"] for c in docs["forkpools.forkd.dev.yaml"]["spec"]["versions"][0][
        "additionalPrinterColumns"]}
    assert {"Ready", "Warm", "Target", "Claimed", "Depth", "SpawnP50", "Age"} <= set(pool)
    assert pool["Warm"] == ".status.warm" and pool["Target"] == ".status.target"
    assert pool["SpawnP50"] == ".status.spawnP50Ms" and pool["Depth"] == ".status.chainDepth"
    parent = {c["name"] for c in docs["forkparents.forkd.dev.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Ready", "Snapshot", "Age"} <= parent


def test_every_spec_and_status_field_has_a_description():
    """Descriptions flow from the models into the CRDs (and `forkd schema`, `forkd explain`)."""
    def walk(node: dict, where: str):
        for name, sub in (node.get("properties") or {}).items():
            assert sub.get("description"), f"{where}.{name} has no description"
            walk(sub, f"{where}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], where + "[]")

    for kind in KINDS:
        schema = open_api_schema(kind)
        for part in ("spec", "status"):
            walk(schema["properties"][part], f"{kind}.{part}")


def _column_resolves(schema: dict, json_path: str) -> bool:
    """A printer column's path names a field of the schema (metadata is Kubernetes')."""
    node = schema
    parts = re.sub(r"\[[^\]]*\]", "[]", json_path).lstrip(".").split(".")
    if parts[0] == "metadata":
        return True
    for part in parts:
        name = part.split("[", 1)[0]
        if node.get("type") == "array":
            node = node["items"]
        node = node.get("properties", {}).get(name)
        if node is None:
            return False
        if "[" in part:  # a filter over a list: continue into its items
            node = node["items"]
    return True


@pytest.mark.parametrize("kind", KINDS)
def test_every_crd_schema_is_structural(kind):
    schema = schema_of(kind)
    assert structural_problems(schema) == []
    text = (CRD_DIR / f"{crd_name(kind)}.yaml").read_text()
    assert "$ref" not in text and "$defs" not in text and "anyOf" not in text and "const" not in text
    props = schema["properties"]
    assert props["metadata"] == {"type": "object"}, "metadata is Kubernetes' to validate"
    assert props["apiVersion"] == {"type": "string"} and props["kind"] == {"type": "string"}
    assert props["status"]["type"] == "object" and "nullable" not in props["status"]
    conds = props["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map" and conds["items"]["required"] == ["type", "status"]
    # defaults must validate against their own node (the API server refuses the CRD otherwise)
    for path, node in _nodes(schema):
        if "default" in node:
            errors = list(jsonschema.Draft202012Validator(to_json_schema(node)).iter_errors(node["default"]))
            assert not errors, f"{kind}{path}: default {node['default']!r}: {errors[0].message}"


def _nodes(node: dict, path: str = ""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{*}}")


def test_schema_keeps_the_models_constraints():
    pool = schema_of("ForkPool")["properties"]["spec"]
    assert pool["required"] == ["from"]
    assert pool["properties"]["warm"] == {"type": "integer", "description": "children kept restored, idle and "
                                          "answering (the /scale subresource's replicas)", "default": 0,
                                          "minimum": 0, "maximum": 1000}
    assert pool["properties"]["child"]["properties"]["network"]["enum"] == ["none", "isolated"]
    assert pool["properties"]["child"]["properties"]["ttlSeconds"]["nullable"] is True
    assert pool["properties"]["spawnLatencyTarget"]["nullable"] is True
    assert pool["properties"]["from"]["pattern"] == MODELS["ForkPool"].model_json_schema(by_alias=True)[
        "$defs"]["ForkPoolSpec"]["properties"]["from"]["pattern"]
    parent = schema_of("ForkParent")
    assert "required" not in parent and parent["properties"]["spec"]["default"] == {}
    assert parent["properties"]["spec"]["properties"]["memoryMiB"]["minimum"] == 128
    assert parent["properties"]["spec"]["properties"]["image"]["properties"]["builtin"]["enum"] == ["python"]
    labels = MODELS["ForkParent"].model_json_schema()["$defs"]["Metadata"]["properties"]["labels"]
    assert labels["additionalProperties"] == {"type": "string"}  # the one map in the models: under metadata
    branch = schema_of("ForkBranch")["properties"]["spec"]
    assert branch["properties"]["sandbox"]["minLength"] == 1
    assert branch["properties"]["mode"]["enum"] == ["live", "diff", "full"]


def test_structural_checker_catches_what_the_api_server_refuses():
    bad = {"type": "object", "properties": {
        "a": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "b": {"$ref": "#/$defs/X"},
        "c": {"type": "object", "additionalProperties": False, "properties": {"d": {"type": "string"}}},
        "e": {"type": "array"},
        "f": {"type": "string", "properties": {"g": {"type": "string"}}},
        "h": {"type": ["string", "null"]},
        "i": {"x-kubernetes-int-or-string": True},
    }, "required": ["zz"]}
    problems = "\n".join(structural_problems(bad))
    for fragment in (".a: no type", ".a: anyOf", ".b: unknown or forbidden keyword '$ref'",
                     ".c: properties and additionalProperties", ".e: array without items",
                     ".f: properties under type 'string'", ".h: type", "required 'zz'"):
        assert fragment in problems, (fragment, problems)
    assert ".i:" not in problems


# -- examples validate ----------------------------------------------------------------------------------------
def example_documents() -> list[tuple[str, dict]]:
    values = load_values([EXAMPLES / "values.yaml"])
    out = []
    for f in collect_files([EXAMPLES]):  # values.yaml is a values file, not objects
        for item in load_paths([f], values=values if f.name.endswith(".j2") else None):
            out.append((f"{f.name}:{item.line}", item.document))
    return out


def test_every_example_validates_against_its_crd():
    docs = example_documents()
    kinds = {d["kind"] for _, d in docs}
    assert {"ForkParent", "ForkPool"} <= kinds and len(docs) >= 7
    for where, doc in docs:
        errors = sorted(validator(doc["kind"]).iter_errors(doc), key=str)
        assert not errors, f"{where}: {[e.message for e in errors]}"
        assert doc["apiVersion"] == "forkd.dev/v1alpha1"


def test_invalid_documents_are_refused_by_the_schema():
    pool = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "p"},
            "spec": {"from": "base", "warm": 2}}
    v = validator("ForkPool")
    assert not list(v.iter_errors(pool))
    for patch, why in (({"warm": -1}, "minimum"), ({"warm": 1001}, "maximum"), ({"replicas": 3}, "unknown field"),
                       ({"from": "Not_A_Name"}, "pattern"), ({"child": {"network": "bridged"}}, "enum"),
                       ({"child": {"ttlSeconds": 0}}, "minimum"), ({"child": {"ttlSeconds": None}}, None),
                       ({"spawnLatencyTarget": {}}, "required"), ({"compaction": None}, None)):
        doc = copy.deepcopy(pool)
        doc["spec"].update(patch)
        errors = list(v.iter_errors(doc))
        assert bool(errors) == (why is not None), (patch, [e.message for e in errors])
    missing = copy.deepcopy(pool)
    del missing["spec"]
    assert list(v.iter_errors(missing))
    assert not list(validator("ForkParent").iter_errors({"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkParent",
                                                          "metadata": {"name": "x"}}))


def test_statuses_the_reconciler_writes_validate():
    cond = {"type": "Ready", "status": "True", "reason": "WarmPoolReady", "message": "2 of 2",
            "lastTransitionTime": "2026-11-29T10:00:00Z"}
    pool = ForkPoolStatus(observedGeneration=3, conditions=[cond], warm=2, claimed=1, target=2, snapshot="p-1",
                          spawnP50Ms=41.5)
    parent = ForkParentStatus(observedGeneration=1, conditions=[cond], snapshot="p-1", specHash="abc")
    for kind, st in (("ForkPool", pool), ("ForkParent", parent)):
        status_schema = to_json_schema(schema_of(kind)["properties"]["status"])
        for dumped in (st.model_dump(mode="json"), st.model_dump(mode="json", exclude_none=True)):
            jsonschema.validate(dumped, status_schema)


def test_deploy_manifests():
    """deploy/kubernetes: the kustomization's files exist; the node daemon is privileged with /dev/kvm and the
    hostPath store; the operator reaches the daemons over TCP (found by their pods), with no host path."""
    deploy = ROOT / "deploy" / "kubernetes"
    kust = yaml.safe_load((deploy / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (deploy / res).exists(), res
    docs = [d for f in sorted(deploy.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text())]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    ds = by_kind[("DaemonSet", "forkd-node")]["spec"]["template"]["spec"]
    [node] = ds["containers"]
    assert node["securityContext"]["privileged"] is True
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in ds["volumes"]}
    assert host["kvm"] == "/dev/kvm" and host["store"] == "/var/lib/forkd"
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    assert mounts["kvm"] == "/dev/kvm" and mounts["store"] == "/var/lib/forkd"
    op = by_kind[("Deployment", "forkd-operator")]["spec"]["template"]["spec"]
    [opc] = op["containers"]
    env = {e["name"]: e for e in opc["env"]}
    assert env["FORKD_NODE_PODS"]["value"].startswith("forkd-system/")  # finds the daemons by their pods
    assert env["FORKD_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "forkd-api-token"
    assert "volumeMounts" not in opc and "FORKD_DAEMON_SOCKET" not in env  # no socket, no host path
    assert opc["command"][:2] == ["forkd", "operator"] and op["serviceAccountName"] == "forkd-operator"
    role = by_kind[("ClusterRole", "forkd-operator")]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    for kind in KINDS:
        assert plural(kind) in resources and f"{plural(kind)}/status" in resources


# -- editor schemas (`forkd schema`) and `forkd explain` ------------------------------------------------------
SCHEMA_DIR = ROOT / "schemas"


def test_checked_in_schemas_match_the_models_and_examples_validate(tmp_path):
    from forkd.spec.schema import schemas

    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "schema", "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    made = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    assert made == {p.name: p.read_text() for p in SCHEMA_DIR.glob("*.json")}, "run `forkd schema --output-dir schemas`"
    assert set(made) == set(schemas()) and "forkd.json" in made
    any_kind = jsonschema.Draft202012Validator(yaml.safe_load(made["forkd.json"]))
    jsonschema.Draft202012Validator.check_schema(any_kind.schema)
    for where, doc in example_documents():
        errors = [e.message for e in any_kind.iter_errors(doc)]
        assert not errors, (where, errors)
    # what `kubectl get -o yaml` adds is not flagged (forkd apply ignores it), a typo is
    doc = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "spec": {"from": "py"}, "status": {"warm": 1},
           "metadata": {"name": "a", "namespace": "default", "uid": "u", "resourceVersion": "1"}}
    assert not list(any_kind.iter_errors(doc))
    assert list(any_kind.iter_errors({**doc, "spec": {"from": "py", "wram": 2}}))


def test_examples_carry_a_schema_modeline():
    for f in collect_files([EXAMPLES]):
        if f.name.endswith(".j2"):
            continue  # a template is not YAML until rendered
        first = f.read_text().splitlines()[0]
        assert first.startswith("# yaml-language-server: $schema=../../schemas/"), f
        assert (EXAMPLES / first.split("=", 1)[1]).resolve().is_file(), f


def test_explain():
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "explain", "ForkPool.spec.child"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "FIELD: ForkPool.spec.child <object>" in res.stdout
    assert "memoryLimitMiB <integer>" in res.stdout and "OOM-killed" in res.stdout
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", "explain", "forkpool.spec.wram", "-o", "json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3 and "has no field 'wram'" in res.stderr and "warm" in res.stderr
