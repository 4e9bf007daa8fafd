"""Load spec files: multi-document YAML, pydantic validation, jinja2 templating for the files that ask for it;
every error of every document of every file at once, each at file:line:column of the offending node (in the
rendered text for a template: the source's lines unless it expands to several). The only I/O is reading spec and
values files ("-" is stdin).

Templating is opt-in: a file whose name ends in `.j2` (e.g. `pool.yaml.j2`) is rendered with jinja2, or every file
with `template=True` (`forkd apply --template`); plain YAML is never rendered, so `run: ['echo ${#HOME}']` stays
what it says. In a directory, `values.yaml` / `values.yml` and `*.values.yaml` / `*.values.yml` are values files
(pass them with `--values`), never objects.

Fields a Kubernetes API server fills in (metadata.uid, resourceVersion, generation,
creationTimestamp, managedFields, finalizers, ..., and status) are accepted and ignored, so
`kubectl get fpool x -o yaml | forkd apply -f -` works."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pydantic
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from forkd.base.durations import EXAMPLES as DURATION_EXAMPLES
from forkd.base.durations import PATTERN as DURATION_PATTERN
from forkd.base.errors import InvalidInput
from forkd.base.names import NAME_PATTERN
from forkd.spec.limits import (
    MAX_FILE_BYTES,
    LimitedEnvironment,
    LimitExceeded,
    check_text,
    check_yaml,
    render_limited,
)
from forkd.spec.models import API_VERSION, KINDS, MODELS, ForkObject

SPEC_SUFFIXES = (".yaml", ".yml", ".j2")
TEMPLATE_SUFFIX = ".j2"
VALUES_NAMES = ("values.yaml", "values.yml")  # and *.values.yaml / *.values.yml: values files, never objects
STDIN = "-"
# set by a Kubernetes API server (kubectl get -o yaml shows them): accepted and dropped
SERVER_METADATA = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                   "finalizers", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences",
                   "generateName")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# YAML must say `from`, never the Python name `from_` (needs pydantic >= 2.11; older ones accept both)
_BY_ALIAS = {"by_name": False} if tuple(map(int, pydantic.VERSION.split(".")[:2])) >= (2, 11) else {}


@dataclass(frozen=True)
class SpecError:
    file: str
    line: int  # 1-based; 0 when the error is about the whole file (missing, unreadable)
    column: int
    path: str  # "spec.warm", "spec.warmup.imports[1]"; "" for the document or file itself
    message: str
    kind: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        who = f"{self.kind}/{self.name}: " if self.kind and self.name else f"{self.kind}: " if self.kind else ""
        return f"{where}: {who}{self.path + ': ' if self.path else ''}{self.message}"


@dataclass(frozen=True)
class Loaded:
    obj: ForkObject
    file: str
    line: int  # where the document starts
    document: dict  # the raw mapping after templating


class SpecLoadError(InvalidInput):
    def __init__(self, errors: list[SpecError]):
        self.errors = list(errors)
        super().__init__("\n".join(map(str, self.errors)) or "invalid spec")


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(out.get(key), dict) and isinstance(value, dict)
        out[key] = deep_merge(out[key], value) if both else value
    return out


def parse_set(items: list[str]) -> dict:
    """["a.b=3", "x=true", "y="] -> {"a": {"b": 3}, "x": True, "y": ""}: values are YAML scalars (lists, mappings
    and dates stay strings); later items win."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise InvalidInput(f"invalid --set {item!r}", hint="use --set key=value or --set a.b=value")
        try:
            value = _load_one(raw, f"--set {key.strip()}") if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        value = value if value is None or isinstance(value, str | int | float | bool) else raw
        for part in reversed(parts):
            value = {part: value}
        out = deep_merge(out, value)
    return out


def load_values(files: list[Path]) -> dict:
    """YAML mapping files deep-merged in order (later files win)."""
    merged: dict = {}
    for path in files:
        try:
            data = _load_one(_read(Path(path)), f"values file {path}") or {}
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidInput(f"cannot read values file {path}: {e}") from None
        except yaml.YAMLError as e:
            raise InvalidInput(f"invalid values file {_yaml_error(e, str(path))}") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"values file {path} must be a YAML mapping, not {type(data).__name__}")
        merged = deep_merge(merged, data)
    return merged


def _load_one(text: str, what: str) -> Any:
    """yaml.safe_load of a single document, bounded (size, nodes with aliases expanded): LimitExceeded names `what`."""
    loader = yaml.SafeLoader(check_text(text, what))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_yaml(node, what)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def build_values(files: list[Path], sets: list[str]) -> dict:
    """--values files merged in order, then --set overrides."""
    return deep_merge(load_values(files), parse_set(sets))


def render(text: str, values: dict, filename: str) -> str:
    """jinja2 with StrictUndefined; values are top-level variables and also `values.x`. Raises SpecLoadError."""
    env = LimitedEnvironment(loader=jinja2.FunctionLoader(lambda n: (text, n, None) if n == filename else None),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        check_text(text, filename)
        return render_limited(env, env.get_template(filename), {**values, "values": values})
    except jinja2.TemplateSyntaxError as e:
        line, message = e.lineno or 1, e.message or str(e)
    except LimitExceeded as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == filename and f.lineno]
        line, message = (lines[-1] if lines else 1), e.message + (f" ({e.hint})" if e.hint else "")
    except (MemoryError, RecursionError) as e:
        line, message = 1, f"{type(e).__name__}: the template needs more memory or nesting than forkd allows"
    except Exception as e:  # template code can raise anything: undefined, type errors, division by zero, ...
        # jinja rewrites the traceback so that template frames carry the template's file name and line
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == filename and f.lineno]
        line, message = (lines[-1] if lines else 1), f"{type(e).__name__}: {e}"
    raise SpecLoadError([SpecError(filename, line, 1, "", f"template: {message}")])


def _yaml_error(exc: yaml.YAMLError, filename: str) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    message = ": ".join(filter(None, (getattr(exc, "context", None), getattr(exc, "problem", None)))) or str(exc)
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    return SpecError(filename, line, column, "", f"invalid YAML: {message}")


def _documents(text: str, filename: str) -> tuple[list[tuple[Node, Any]], list[SpecError]]:
    """(node, data) of each non-empty document, up to the first YAML error."""
    loader, docs, node = yaml.SafeLoader(text), [], None
    try:
        while loader.check_node():
            node = loader.get_node()
            check_yaml(node, filename)
            data = loader.construct_document(node)
            if data is not None:
                docs.append((node, data))
    except yaml.YAMLError as e:
        return docs, [_yaml_error(e, filename)]
    except LimitExceeded as e:
        line = node.start_mark.line + 1 if node is not None else 1
        return docs, [SpecError(filename, line, 1, "", e.message + (f" ({e.hint})" if e.hint else ""))]
    finally:
        loader.dispose()
    return docs, []


def _locate(node: Node, loc: tuple, at_key: bool) -> Node:
    """The node at pydantic's `loc`: the value, or the key (at_key), or the parent mapping of a missing field."""
    key = None
    for part in loc:
        if isinstance(node, MappingNode) and part != "[key]":
            pairs = [kv for kv in node.value if isinstance(kv[0], ScalarNode) and kv[0].value == str(part)]
            if not pairs:
                return node
            key, node = pairs[-1]  # the last of duplicate keys wins, as when constructing
        elif isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            key, node = None, node.value[part]
        else:
            return key if part == "[key]" and key is not None else node
    return key if at_key and key is not None else node


class _Doc:
    def __init__(self, node: Node, data: Any, file: str):
        self.node, self.data, self.file = node, data, file
        meta = data.get("metadata") if isinstance(data, dict) else None
        self.kind = data.get("kind") if isinstance(data, dict) and data.get("kind") in KINDS else None
        self.name = meta.get("name") if isinstance(meta, dict) and isinstance(meta.get("name"), str) else None

    def error(self, loc: tuple, message: str, at_key: bool = False) -> SpecError:
        mark = _locate(self.node, loc, at_key).start_mark
        path = "".join(f"[{p}]" if isinstance(p, int) or str(p).startswith("[") else f".{p}" for p in loc)[1:]
        return SpecError(self.file, mark.line + 1, mark.column + 1, path, message, self.kind, self.name)


def _precheck(doc: _Doc) -> tuple[dict | None, list[SpecError]]:
    """apiVersion, kind and the fields forkd owns: errors, and the document to validate (None if kind is unusable)."""
    if not isinstance(doc.data, dict):
        got = type(doc.data).__name__
        return None, [doc.error((), f"a document must be a mapping (apiVersion, kind, metadata, spec), not {got}")]
    data, errors = dict(doc.data), []
    if data.get("apiVersion") != API_VERSION:
        errors.append(doc.error(("apiVersion",), f"apiVersion must be {API_VERSION}"))
    if doc.kind is None:
        got = f"unknown kind {data['kind']!r}" if "kind" in data else "kind is required"
        return None, [*errors, doc.error(("kind",), f"{got} (expected one of {', '.join(KINDS)})")]
    data.pop("status", None)  # set by forkd (or an API server): ignored
    meta = data.get("metadata")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if k not in SERVER_METADATA}
        if isinstance(meta.get("annotations"), dict) and LAST_APPLIED in meta["annotations"]:
            meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
        data["metadata"] = meta
    return data, errors


def _message(err: dict) -> str:
    if err["type"] == "missing":
        return "field required"
    if err["type"] == "extra_forbidden":
        return f"unknown field '{err['loc'][-1]}'"
    if err["type"] == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == NAME_PATTERN:
        return f"invalid name {err['input']!r}: use 1-52 of a-z, 0-9 and '-', starting and ending with a-z or 0-9"
    if err["type"] == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == DURATION_PATTERN:
        return f"{err['input']!r} is not a duration: use {DURATION_EXAMPLES}"
    return err["msg"]


def _validate(doc: _Doc) -> tuple[ForkObject | None, list[SpecError]]:
    data, errors = _precheck(doc)
    if data is None:
        return None, errors
    try:
        obj = MODELS[doc.kind].model_validate(data, **_BY_ALIAS)
    except pydantic.ValidationError as e:
        return None, errors + [doc.error(err["loc"], _message(err), at_key=err["type"] == "extra_forbidden")
                               for err in e.errors() if err["loc"][:1] != ("apiVersion",)]  # reported above
    return (None, errors) if errors else (obj, [])


def is_template(filename: str, template: bool = False) -> bool:
    """Is this file rendered with jinja2 before parsing: its name ends in .j2, or `template` says so."""
    return template or filename.endswith(TEMPLATE_SUFFIX)


def is_values_file(path: Path) -> bool:
    """values.yaml, values.yml, *.values.yaml, *.values.yml: template values, not objects."""
    return path.name in VALUES_NAMES or path.name.endswith(tuple("." + n for n in VALUES_NAMES))


def load_text(text: str, filename: str, values: dict | None = None,
              template: bool | None = None) -> tuple[list[Loaded], list[SpecError]]:
    """Parse and validate one file's text (rendered first when it is a template: `template`, or by default a name
    ending in .j2): the valid objects, and the errors of the invalid ones."""
    rendered = text
    if template or (template is None and is_template(filename)):
        try:
            rendered = render(text, values or {}, filename)
        except SpecLoadError as e:
            return [], e.errors
    else:
        try:
            check_text(text, filename)
        except LimitExceeded as e:
            return [], [SpecError(filename, 0, 0, "", e.message)]
    docs, errors = _documents(rendered, filename)
    loaded = []
    for node, data in docs:
        obj, errs = _validate(_Doc(node, data, filename))
        errors += errs
        if obj is not None:
            loaded.append(Loaded(obj, filename, node.start_mark.line + 1, data))
    return loaded, sorted(errors, key=lambda e: (e.line, e.column))


def _read(path: Path) -> str:
    """The text of a spec or values file ("-": stdin), at most MAX_FILE_BYTES (read no further)."""
    if str(path) == STDIN:
        text = sys.stdin.read(MAX_FILE_BYTES + 1)
    else:
        with open(path, "rb") as f:
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
    return check_text(text, "<stdin>" if str(path) == STDIN else str(path))


def collect_files(paths: list[Path], recursive: bool = False, errors: list[SpecError] | None = None) -> list[Path]:
    """A directory yields its *.yaml/*.yml/*.j2 files (not its values files), sorted; subdirectories only with
    `recursive`. A path that
    yields no file is a SpecError: appended to `errors` when given, else raised (SpecLoadError)."""
    files: list[Path] = []
    bad: list[SpecError] = []
    for path in map(Path, paths):
        if str(path) == STDIN or path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in (path.rglob("*") if recursive else path.iterdir())
                           if p.suffix in SPEC_SUFFIXES and p.is_file() and not is_values_file(p))
            hint = "" if recursive else " (subdirectories are read only with --recursive)"
            files += found
            bad += [] if found else [SpecError(str(path), 0, 0, "", f"no spec files{hint}")]
        else:
            bad.append(SpecError(str(path), 0, 0, "", "no such file or directory"))
    if errors is None and bad:
        raise SpecLoadError(bad)
    if errors is not None:
        errors.extend(bad)
    return files


def check_duplicates(loaded: list[Loaded], first: dict | None = None) -> list[SpecError]:
    """An error at each object whose kind and name an earlier one (in `loaded` or `first`) already has."""
    first = {} if first is None else first
    errors = []
    for item in loaded:
        kind, name = item.obj.kind, item.obj.metadata.name
        if (prev := first.setdefault((kind, name), item)) is not item:
            message = f"duplicate {kind} '{name}' (first defined at {prev.file}:{prev.line})"
            errors.append(SpecError(item.file, item.line, 1, "metadata.name", message, kind, name))
    return errors


def load_paths(paths: list[Path], recursive: bool = False, values: dict | None = None,
               template: bool = False) -> list[Loaded]:
    """Every object of every file, in file order; or SpecLoadError with every error (missing paths first, then
    file by file, by line). Files are rendered only if they are templates (*.j2, or every file with `template`);
    `values` given while no file is one is an error (they would be silently unused)."""
    loaded: list[Loaded] = []
    errors: list[SpecError] = []
    first: dict = {}
    files = collect_files(paths, recursive, errors)
    if values and files and not any(is_template(str(p), template) for p in files):
        raise InvalidInput("--set / --values given, but no file is a template",
                           hint="name templates *.j2 (e.g. pool.yaml.j2), or pass --template to render plain YAML")
    for path in files:
        name = "<stdin>" if str(path) == STDIN else str(path)
        try:
            objs, errs = load_text(_read(path), name, values, template=is_template(name, template))
        except (OSError, UnicodeDecodeError) as e:
            objs, errs = [], [SpecError(name, 0, 0, "", f"cannot read: {e}")]
        except LimitExceeded as e:
            objs, errs = [], [SpecError(name, 0, 0, "", e.message)]
        loaded += objs
        errors += sorted(errs + check_duplicates(objs, first), key=lambda e: (e.line, e.column))
    if errors:
        raise SpecLoadError(errors)
    return loaded
