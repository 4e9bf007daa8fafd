"""Spec loader: templating, multi-document YAML, validation errors at file:line:column, all errors at once. No VMs."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput
from forkd.spec.loader import (
    SpecError,
    SpecLoadError,
    build_values,
    collect_files,
    load_paths,
    load_text,
    load_values,
    parse_set,
    render,
)
from forkd.spec.models import ForkParent, ForkPool

HEAD = "apiVersion: forkd.dev/v1alpha1\n"
PARENT = HEAD + "kind: ForkParent\nmetadata:\n  name: py\nspec:\n  warmup:\n    imports: [json]\n"
POOL = HEAD + "kind: ForkPool\nmetadata:\n  name: web\nspec:\n  from: py\n  warm: 2\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def errors_of(tmp_path: Path, text: str, **kw) -> list[SpecError]:
    f = write(tmp_path / "spec.yaml", text)
    with pytest.raises(SpecLoadError) as exc:
        load_paths([f], **kw)
    return exc.value.errors


def one_error(tmp_path: Path, text: str, **kw) -> SpecError:
    errors = errors_of(tmp_path, text, **kw)
    assert len(errors) == 1, errors
    return errors[0]


def test_valid_multi_document_file(tmp_path):
    f = write(tmp_path / "all.yaml", f"# parent and pool\n{PARENT}---\n---\n{POOL}")
    loaded = load_paths([f])
    assert [type(item.obj) for item in loaded] == [ForkParent, ForkPool]
    parent, pool = (item.obj for item in loaded)
    assert parent.spec.warmup.imports == ["json"]
    assert pool.spec.from_ == "py" and pool.spec.warm == 2
    assert [(item.file, item.line) for item in loaded] == [(str(f), 2), (str(f), 11)]
    assert loaded[1].document["spec"] == {"from": "py", "warm": 2}


BAD_POOL = HEAD + """kind: ForkPool
metadata:
  name: web
spec:
  from: py
  {field}
"""


@pytest.mark.parametrize(
    "field, line, column, path, message",
    [
        ("replicas: 3", 7, 3, "spec.replicas", "unknown field 'replicas'"),
        ("warm: -1", 7, 9, "spec.warm", "Input should be greater than or equal to 0"),
        ("warm: lots", 7, 9, "spec.warm", "Input should be a valid integer"),
        ("warm: [1]", 7, 9, "spec.warm", "Input should be a valid integer"),
        ("child: {network: open}", 7, 20, "spec.child.network", "Input should be 'none' or 'isolated'"),
        ("child:\n    bogus: 1", 8, 5, "spec.child.bogus", "unknown field 'bogus'"),
        ("from_: py", 7, 3, "spec.from_", "unknown field 'from_'"),  # YAML says `from`, not the Python name
    ],
)
def test_field_errors_point_at_the_node(tmp_path, field, line, column, path, message):
    err = one_error(tmp_path, BAD_POOL.format(field=field))
    assert (err.line, err.column, err.path) == (line, column, path)
    assert err.message.startswith(message)
    assert (err.kind, err.name) == ("ForkPool", "web")
    assert str(err).startswith(f"{tmp_path / 'spec.yaml'}:{line}:{column}: ForkPool/web: {path}: ")


@pytest.mark.parametrize(
    "text, line, column, path, message",
    [
        # missing required field: at the parent mapping
        (HEAD + "kind: ForkPool\nmetadata:\n  name: web\nspec:\n  warm: 1\n", 6, 3, "spec.from", "field required"),
        (HEAD + "kind: ForkLayer\nmetadata:\n  name: l\n", 1, 1, "spec", "field required"),
        (HEAD + "kind: ForkParent\nmetadata:\n  name: Web\n", 4, 9, "metadata.name", "invalid name 'Web'"),
        (HEAD + "kind: ForkParent\nmetadata:\n  name: -x\n", 4, 9, "metadata.name", "invalid name '-x'"),
        (HEAD + "kind: ForkParent\nmetadata: {name: p}\nspec:\n  warmup:\n    imports: [os, 1bad]\n",
         6, 19, "spec.warmup.imports[1]", "Value error, '1bad' is not a module name"),
        (HEAD + "kind: ForkPod\nmetadata: {name: p}\n", 2, 7, "kind",
         "unknown kind 'ForkPod' (expected one of ForkParent, ForkLayer, ForkPool, ForkBranch, ForkClaim)"),
        (HEAD + "metadata: {name: p}\n", 1, 1, "kind", "kind is required"),
        ("apiVersion: v1\nkind: ForkParent\nmetadata: {name: p}\n", 1, 13, "apiVersion",
         "apiVersion must be forkd.dev/v1alpha1"),
        ("- just\n- a list\n", 1, 1, "", "a document must be a mapping"),
    ],
)
def test_document_errors(tmp_path, text, line, column, path, message):
    err = one_error(tmp_path, text)
    assert (err.line, err.column, err.path) == (line, column, path)
    assert err.message.startswith(message)


def test_all_errors_of_all_files_at_once(tmp_path):
    a = write(tmp_path / "a.yaml", BAD_POOL.format(field="warm: -1") + "---\n" + PARENT.replace("py", "P"))
    b = write(tmp_path / "b.yaml", BAD_POOL.format(field="replicas: 2"))
    good = write(tmp_path / "c.yaml", PARENT)
    with pytest.raises(SpecLoadError) as exc:
        load_paths([b, good, a])
    got = [(e.file, e.line, e.path) for e in exc.value.errors]
    assert got == [(str(b), 7, "spec.replicas"), (str(a), 7, "spec.warm"), (str(a), 12, "metadata.name")]
    assert isinstance(exc.value, InvalidInput) and exc.value.exit_code == 2
    assert exc.value.message.splitlines() == [str(e) for e in exc.value.errors]


def test_yaml_syntax_error_line(tmp_path):
    err = one_error(tmp_path, HEAD + "kind: ForkParent\nmetadata:\n  name: [p\nspec: {}\n")
    assert (err.line, err.path) == (5, "")
    assert err.message.startswith("invalid YAML:")


def test_valid_documents_before_a_syntax_error_are_still_checked(tmp_path):
    errors = errors_of(tmp_path, BAD_POOL.format(field="warm: -1") + "---\nkey: : :\n")
    assert [(e.line, e.message.split(":")[0]) for e in errors] == [(7, "Input should be greater than or equal to 0"),
                                                                  (9, "invalid YAML")]


def test_duplicate_objects_across_files(tmp_path):
    a = write(tmp_path / "a.yaml", POOL)
    b = write(tmp_path / "b.yaml", PARENT + "---\n" + POOL)
    with pytest.raises(SpecLoadError) as exc:
        load_paths([a, b])
    (err,) = exc.value.errors
    assert (err.file, err.line, err.path) == (str(b), 9, "metadata.name")
    assert f"duplicate ForkPool 'web' (first defined at {a}:1)" in str(err)


def test_same_name_different_kind_is_fine(tmp_path):
    f = write(tmp_path / "a.yaml", PARENT + "---\n" + PARENT.replace("ForkParent", "ForkLayer").replace(
        "spec:\n  warmup:\n    imports: [json]\n", "spec:\n  from: py\n"))
    assert [item.obj.kind for item in load_paths([f])] == ["ForkParent", "ForkLayer"]


# -- templating and values --------------------------------------------------------------------------
POOL_J2 = POOL.replace("warm: 2", "warm: {{ warm }}")


@pytest.mark.parametrize(
    "items, expected",
    [
        (["warm=5"], {"warm": 5}),
        (["a.b=c", "a.d=true", "a.e=1.5"], {"a": {"b": "c", "d": True, "e": 1.5}}),
        (["x=", "y=null", "s=two words", "eq=a=b"], {"x": "", "y": None, "s": "two words", "eq": "a=b"}),
        (["l=[1, 2]", "d=2024-01-01"], {"l": "[1, 2]", "d": "2024-01-01"}),  # scalars only
        (["a=1", "a=2"], {"a": 2}),
    ],
)
def test_parse_set(items, expected):
    assert parse_set(items) == expected


@pytest.mark.parametrize("item", ["warm", "=3", "a..b=1"])
def test_parse_set_rejects(item):
    with pytest.raises(InvalidInput):
        parse_set([item])


def test_set_value_is_an_int(tmp_path):
    f = write(tmp_path / "pool.yaml.j2", POOL_J2)
    (item,) = load_paths([f], values=parse_set(["warm=5"]))
    assert item.obj.spec.warm == 5 and isinstance(item.obj.spec.warm, int)


def test_values_files_merge_and_set_overrides(tmp_path):
    v1 = write(tmp_path / "v1.yaml", "pool: {warm: 1, name: web}\n")
    v2 = write(tmp_path / "v2.yaml", "pool: {warm: 3}\n")
    assert load_values([v1, v2]) == {"pool": {"warm": 3, "name": "web"}}
    f = write(tmp_path / "pool.yaml.j2", POOL.replace("warm: 2", "warm: {{ values.pool.warm }}").replace(
        "name: web", "name: {{ pool.name }}"))
    (item,) = load_paths([f], values=load_values([v1, v2]))
    assert (item.obj.metadata.name, item.obj.spec.warm) == ("web", 3)
    (item,) = load_paths([f], values=build_values([v1, v2], ["pool.warm=7"]))
    assert (item.obj.metadata.name, item.obj.spec.warm) == ("web", 7)


@pytest.mark.parametrize("text", ["- a list\n", "a: [1\n"])
def test_bad_values_file(tmp_path, text):
    with pytest.raises(InvalidInput):
        load_values([write(tmp_path / "v.yaml", text)])


def test_undefined_variable_names_file_and_line(tmp_path):
    err = one_error(tmp_path, POOL_J2, template=True)
    assert (err.file, err.line) == (str(tmp_path / "spec.yaml"), 7)
    assert "'warm' is undefined" in err.message
    assert str(err).startswith(f"{tmp_path / 'spec.yaml'}:7:1: ")


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("a: 1\n\n{% if %}\n", 3, "template:"),
        ("a: 1\nb: {{ x.missing }}\n", 2, "has no attribute 'missing'"),
        ("a: 1\n\n\nb: {{ 1 // 0 }}\n", 4, "division"),
    ],
)
def test_template_errors(text, line, message):
    loaded, errors = load_text(text, "t.yaml.j2", {"x": {}})
    assert loaded == []
    assert [(e.file, e.line) for e in errors] == [("t.yaml.j2", line)]
    assert message in errors[0].message


def test_plain_yaml_is_never_rendered(tmp_path):
    """Shell in a plain .yaml file means what it says: `${#HOME}` was a jinja comment opener before (issue 17)."""
    f = write(tmp_path / "p.yaml", PARENT.replace("imports: [json]", "run: ['echo ${#HOME} {{ x }}']"))
    (item,) = load_paths([f])
    assert item.obj.spec.warmup.run == ["echo ${#HOME} {{ x }}"]
    with pytest.raises(SpecLoadError, match="template:"):  # the same text asked to be a template is one
        load_paths([f], template=True)


def test_values_without_a_template_are_refused(tmp_path):
    f = write(tmp_path / "p.yaml", PARENT)
    with pytest.raises(InvalidInput, match="no file is a template"):
        load_paths([f], values={"warm": 3})


def test_a_directory_skips_values_files(tmp_path):
    write(tmp_path / "values.yaml", "warm: 3\n")
    write(tmp_path / "pool.values.yml", "warm: 4\n")
    write(tmp_path / "a.yaml", PARENT)
    write(tmp_path / "pool.yaml.j2", POOL_J2.replace("{{ warm }}", "{{ warm | default(1) }}"))
    assert collect_files([tmp_path]) == [tmp_path / "a.yaml", tmp_path / "pool.yaml.j2"]
    assert [i.obj.metadata.name for i in load_paths([tmp_path])] == ["py", "web"]


def test_the_examples_directory_loads_as_is():
    """`forkd apply -f specs/examples/` reads every example (the template with its defaults), values.yaml not."""
    examples = Path(__file__).resolve().parents[1] / "specs" / "examples"
    names = {(i.obj.kind, i.obj.metadata.name) for i in load_paths([examples])}
    assert {("ForkPool", "agents"), ("ForkPool", "tmpl"), ("ForkParent", "base")} <= names


def test_server_populated_fields_are_accepted_and_ignored(tmp_path):
    """What `kubectl get -o yaml` prints goes back through `forkd apply -f -`."""
    text = HEAD + textwrap.dedent("""\
        kind: ForkPool
        metadata:
          name: web
          namespace: default
          uid: 0b6f2c7e-1111-2222-3333-444455556666
          resourceVersion: "4242"
          generation: 3
          creationTimestamp: "2026-01-01T00:00:00Z"
          finalizers: [forkd.dev/finalizer]
          managedFields: [{manager: kubectl, operation: Update}]
          annotations:
            kubectl.kubernetes.io/last-applied-configuration: '{"a": 1}'
            team: x
        spec: {from: py, warm: 2}
        status:
          warm: 2
          conditions: [{type: Ready, status: "True"}]
        """)
    (item,) = load_paths([write(tmp_path / "k.yaml", text)])
    assert item.obj.metadata.annotations == {"team": "x"} and item.obj.metadata.generation == 0
    assert item.obj.status is None and item.obj.spec.warm == 2


def test_render_keeps_trailing_newline():
    assert render("a: {{ a }}\n", {"a": 1}, "t") == "a: 1\n"


# -- files ------------------------------------------------------------------------------------------
def test_directory_non_recursive_vs_recursive(tmp_path):
    write(tmp_path / "b.yml", POOL)
    write(tmp_path / "a.yaml", PARENT)
    write(tmp_path / "notes.txt", "not a spec")
    write(tmp_path / "sub" / "c.yaml.j2", POOL.replace("web", "api"))
    assert collect_files([tmp_path]) == [tmp_path / "a.yaml", tmp_path / "b.yml"]
    assert collect_files([tmp_path], recursive=True) == [tmp_path / "a.yaml", tmp_path / "b.yml",
                                                         tmp_path / "sub" / "c.yaml.j2"]
    assert [i.obj.metadata.name for i in load_paths([tmp_path])] == ["py", "web"]
    assert [i.obj.metadata.name for i in load_paths([tmp_path], recursive=True)] == ["py", "web", "api"]


def test_missing_path_and_empty_directory_are_errors(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    write(tmp_path / "empty" / "sub" / "x.yaml", PARENT)
    with pytest.raises(SpecLoadError) as exc:
        load_paths([tmp_path / "nope.yaml", tmp_path / "empty"])
    assert [(e.file, e.message) for e in exc.value.errors] == [
        (str(tmp_path / "nope.yaml"), "no such file or directory"),
        (str(tmp_path / "empty"), "no spec files (subdirectories are read only with --recursive)"),
    ]
    assert str(exc.value.errors[0]) == f"{tmp_path / 'nope.yaml'}: no such file or directory"
    with pytest.raises(SpecLoadError):
        collect_files([tmp_path / "nope.yaml"])


def test_stdin(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(POOL_J2))
    (item,) = load_paths([Path("-")], values={"warm": 4}, template=True)
    assert (item.file, item.obj.spec.warm) == ("<stdin>", 4)


def test_empty_files_and_documents_yield_nothing(tmp_path):
    f = write(tmp_path / "empty.yaml", "# nothing here\n---\n---\n")
    assert load_paths([f]) == []


# -- the spec objects build the core's typed requests ------------------------------------------------------
def test_objects_build_the_cores_requests(tmp_path):
    from forkd.core import requests as rq
    from forkd.spec.models import ForkBranch, ForkLayer

    parent = ForkParent(metadata={"name": "py"}, spec={"memoryMiB": 256, "vcpus": 2, "network": "isolated",
                                                       "warmup": {"imports": ["json"], "run": ["true"],
                                                                  "exec": ["X = 1"]}})
    assert parent.to_request("py-1", "img", {"k": "v"}) == rq.ParentBuild(
        tag="py-1", memory_mib=256, vcpus=2, warm_imports=("json",), warm_run=("true",), warm_exec=("X = 1",),
        network="isolated", image_id="img", labels={"k": "v"})
    layer = ForkLayer(metadata={"name": "l"}, spec={"from": "py", "run": ["echo"], "imports": ["csv"]})
    assert layer.to_request("l-1", "py-1") == rq.LayerBuild(tag="l-1", parent_tag="py-1", run=("echo",),
                                                             imports=("csv",))
    pool = ForkPool(metadata={"name": "web"}, spec={"from": "py", "child": {"memoryLimitMiB": 256}})
    assert pool.to_request("py-1", 3) == rq.Spawn(tag="py-1", n=3, pool="web", memory_limit_mib=256)
    branch = ForkBranch(metadata={"name": "b"}, spec={"sandbox": "c1", "mode": "full"})
    assert branch.to_request("c1", "b-1") == rq.Branch(child_id="c1", tag="b-1", mode="full", wait=True)
    # a request that breaks the core's rule names the field (the reconciler records it as a TerminalError)
    with pytest.raises(InvalidInput, match="invalid Spawn: n: Input should be less than or equal to 1000"):
        pool.to_request("py-1", 1001)
    with pytest.raises(InvalidInput, match="invalid ParentBuild: tag"):
        parent.to_request("Not A Tag")


@pytest.mark.parametrize("spec, path, message", [
    ("memoryMiB: 64", "spec.memoryMiB", "Input should be greater than or equal to 128"),
    ("vcpus: 65", "spec.vcpus", "Input should be less than or equal to 64"),
    ("network: bridged", "spec.network", "Input should be 'none' or 'isolated'"),
])
def test_parent_fields_follow_the_cores_rules(tmp_path, spec, path, message):
    err = one_error(tmp_path, HEAD + f"kind: ForkParent\nmetadata: {{name: p}}\nspec:\n  {spec}\n")
    assert (err.line, err.path) == (5, path) and err.message.startswith(message)


def test_cli_applies_the_examples_directory_dry_run(tmp_path):
    """`forkd apply -f specs/examples/` loads (client dry run: nothing reaches a backend); a bad flag exits 2."""
    import os
    import subprocess
    import sys

    examples = Path(__file__).resolve().parents[1] / "specs" / "examples"
    env = dict(os.environ, FORKD_HOME=str(tmp_path / "home"), FORKD_NO_DAEMON="1")
    run = [sys.executable, "-m", "forkd.cli.main", "apply", "-f", str(examples)]
    res = subprocess.run([*run, "--dry-run", "client"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ForkPool/tmpl validated" in res.stdout and "ForkClaim/session-42 validated" in res.stdout
    res = subprocess.run([*run, "--wait", "--timeout", "abc"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "not a duration" in res.stderr and "90s, 5m" in res.stderr, res.stderr
    assert not (tmp_path / "home" / "objects").exists() or not any((tmp_path / "home" / "objects").rglob("*.json"))
