"""kubectl-like commands over the declarative objects: apply, diff, get, describe, delete, claim; and for editors
and people, schema and explain."""

from __future__ import annotations

import json
import sys
import time
from enum import StrEnum
from pathlib import Path

import typer

from forkd.base.errors import InvalidInput
from forkd.cli import objects
from forkd.cli.daemon import backend
from forkd.cli.options import complete_pools, count, count_option, format_or_old_path, lifetime_option, timeout_option
from forkd.cli.output import Fmt, emit, err, out
from forkd.spec.namespaces import DEFAULT, check_namespace, qname

FILES = typer.Option(..., "-f", "--filename", help="file or directory of YAML specs ('-' for stdin); repeatable")
RECURSIVE = typer.Option(False, "-R", "--recursive", help="also read subdirectories of -f directories")
SETS = typer.Option([], "--set", help="template value k=v (dots nest: a.b=1); repeatable; for *.j2 files (or with "
                                     "--template)")
VALUES = typer.Option([], "--values", help="YAML file of template values; repeatable; for *.j2 files (or with "
                                           "--template)")
TEMPLATE = typer.Option(False, "--template", help="render every file with jinja2, not only *.j2 ones (plain YAML "
                                                  "is otherwise never rendered)")
NAMESPACE = typer.Option(None, "-n", "--namespace", help="the namespace (default: default); with -f: the namespace "
                         "of documents that name none (one naming another is refused)")
ALL_NAMESPACES = typer.Option(False, "-A", "--all-namespaces", help="list objects of every namespace")
NO_DAEMON_WARNING = ("no forkd daemon answers: the objects are stored, but nothing reconciles them until one runs. "
                     "Start one with 'forkd serve' (or 'forkd serve --watch DIR'), or pass --wait to reconcile in "
                     "this process until they are Ready.")


class DryRun(StrEnum):
    none = "none"
    client = "client"
    server = "server"


class ApplyOut(StrEnum):
    text = "text"
    yaml = "yaml"
    json = "json"
    name = "name"


class GetOut(StrEnum):
    table = "table"
    wide = "wide"
    yaml = "yaml"
    json = "json"


def _load(files: list[str], recursive: bool, sets: list[str], values: list[Path], template: bool = False,
          namespace: str | None = None):
    from forkd.spec.loader import build_values, load_paths

    loaded = load_paths([Path(f) for f in files], recursive=recursive, values=build_values(values, sets),
                        template=template)
    return [(_in_namespace(item.obj, namespace, f"{item.file}:{item.line}"), f"{item.file}:{item.line}")
            for item in loaded]


def _in_namespace(obj, namespace: str | None, where: str):
    """kubectl's rule: -n gives its namespace to a document that names none, and refuses one naming another."""
    if namespace is None:
        return obj
    check_namespace(namespace)
    if "namespace" in obj.metadata.model_fields_set:
        if obj.metadata.namespace != namespace:
            raise InvalidInput(f"{where}: metadata.namespace is {obj.metadata.namespace!r} but -n says "
                               f"{namespace!r}", hint="drop -n, or the document's metadata.namespace")
        return obj
    return obj.model_copy(update={"metadata": obj.metadata.model_copy(update={"namespace": namespace})})


def _ns(namespace: str | None) -> str:
    return check_namespace(namespace) if namespace is not None else DEFAULT


def _sources(files: list[str]) -> list[str]:
    return [str(Path(f).resolve()) if f != "-" else "-" for f in files]


def register(app: typer.Typer) -> None:
    app.command()(apply)
    app.command()(diff)
    app.command()(get)
    app.command()(describe)
    app.command()(delete)
    app.command()(claim)
    app.command()(schema)
    app.command()(explain)


def apply(files: list[str] = FILES, recursive: bool = RECURSIVE, sets: list[str] = SETS,
          values: list[Path] = VALUES, template: bool = TEMPLATE,
          dry_run: DryRun = typer.Option(DryRun.none, "--dry-run", help="client: validate only; server: also "
                                                                           "compare with what is applied"),
          prune: bool = typer.Option(False, help="delete objects earlier applied from the same apply set "
                                                 "that these files no longer contain"),
          applyset: str | None = typer.Option(None, help="apply set name (default: derived from -f paths)"),
          wait: bool = typer.Option(False, help="wait until every applied object is Ready"),
          timeout: str = timeout_option("5m", "with --wait: give up after this long"),
          output: ApplyOut = typer.Option(ApplyOut.text, "-o", "--output"),
          namespace: str | None = NAMESPACE) -> None:
    """Create or update objects from YAML. Any invalid document, or flag, means nothing is applied (exit 2).

    Files ending in .j2 are jinja2 templates (values from --set / --values); other files are plain YAML, never
    rendered, unless --template. Fields a Kubernetes API server sets (metadata.uid, resourceVersion, status, ...)
    are ignored, so `kubectl get ... -o yaml | forkd apply -f -` works."""
    from forkd.client import LocalBackend, applyset_id
    from forkd.spec.models import to_document

    objs = _load(files, recursive, sets, values, template, namespace)
    aset = applyset or applyset_id(_sources(files))
    b = backend() if dry_run != DryRun.client else None
    if dry_run == DryRun.client:
        changes = [{"kind": o.kind, "name": o.metadata.name, "change": "validated",
                     "namespace": o.metadata.namespace} for o, _ in objs]
    else:
        changes = [c.__dict__ for c in b.apply(objs, aset, prune=prune, dry_run=dry_run == DryRun.server)]
    suffix = f" (dry run: {dry_run.value})" if dry_run != DryRun.none else ""
    if output == ApplyOut.name:
        for c in changes:
            print(f"{c['kind'].lower()}/{_shown(c)}")
    elif output in (ApplyOut.json, ApplyOut.yaml):
        docs = [to_document(o) for o, _ in objs]
        emit(docs, Fmt(output.value))
    else:
        for c in changes:
            out.print(f"{c['kind']}/{_shown(c)} {c['change']}{suffix}")
    if dry_run == DryRun.none and not wait and isinstance(b, LocalBackend):
        err.print(f"[yellow]warning:[/] {NO_DAEMON_WARNING}")
    if wait and dry_run == DryRun.none:
        targets = [(o.kind, qname(o.metadata.namespace, o.metadata.name)) for o, _ in objs]
        ok, problems = b.wait(targets, timeout, progress=lambda s: err.print(f"[dim]{s}[/]"))
        for p in problems:
            err.print(f"[red]not ready:[/] {p}")
        if not ok:
            raise typer.Exit(1)
        err.print("all objects Ready")


def diff(files: list[str] = FILES, recursive: bool = RECURSIVE, sets: list[str] = SETS,
         values: list[Path] = VALUES, template: bool = TEMPLATE, namespace: str | None = NAMESPACE) -> None:
    """Show what apply would change. Exit 0: no change; 1: changes; 2 or more: error."""
    changes = backend().diff(_load(files, recursive, sets, values, template, namespace))
    for _, text in changes:
        sys.stdout.write(text)
    raise typer.Exit(1 if changes else 0)


def _shown(c: dict) -> str:
    """NAME, or NAMESPACE/NAME outside the namespace "default" (as apply and delete print them)."""
    ns = c.get("namespace") or DEFAULT
    return c["name"] if ns == DEFAULT else f"{ns}/{c['name']}"


def get(resource: str = typer.Argument(..., help="parents | layers | pools | branches | claims, or KIND/NAME"),
        name: str | None = typer.Argument(None), output: GetOut = typer.Option(GetOut.table, "-o", "--output"),
        namespace: str | None = NAMESPACE, all_namespaces: bool = ALL_NAMESPACES):
    """List objects of one kind, with their status (AGE: since the object was first applied); of one namespace
    (-n, default: default) or of all (-A, with a NAMESPACE column)."""
    objects.get(resource, name, output.value, namespace, all_namespaces)


def schema(output_dir: Path | None = typer.Option(None, "--output-dir", help="write one JSON Schema per kind "
                                                   "and forkd.json (any kind) here; default: print forkd.json"),
           output: str | None = typer.Option(None, "-o", "--output", help="output format: json (the default)")
           ) -> None:
    """JSON Schemas of the spec objects, for editors: put `# yaml-language-server: $schema=PATH/forkd.json` at the
    top of a spec file (the YAML language server, VS Code's YAML extension, ...)."""
    from forkd.base.atomic import write_bytes
    from forkd.spec.schema import schemas

    fmt, old_path = format_or_old_path(output, "--output-dir")
    if fmt not in (None, Fmt.json):
        raise typer.BadParameter("JSON Schemas are printed as JSON", param_hint="-o")
    output_dir = output_dir or (Path(old_path) if old_path else None)
    files = schemas()
    if output_dir is None:
        sys.stdout.write(json.dumps(files["forkd.json"], indent=2) + "\n")
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    for fname, doc in files.items():
        text = json.dumps(doc, indent=2) + "\n"
        path = output_dir / fname
        if not path.exists() or path.read_text() != text:
            write_bytes(path, text.encode())
        print(path)


def explain(path: str = typer.Argument(..., help="KIND[.field...], e.g. ForkPool.spec.child"),
            output: Fmt = typer.Option(Fmt.table, "-o", "--output")) -> None:
    """Describe a field of a spec object and the fields under it, like kubectl explain."""
    from forkd.spec.schema import explain as explain_path

    info = explain_path(path)
    if output != Fmt.table:
        emit(info, output)
        return
    out.print(f"[bold]KIND:[/]  {info['kind']}\n[bold]FIELD:[/] {info['path']} <{info['type']}>"
              + (" (required)" if info["required"] and "." in info["path"] else ""))
    if info["description"]:
        out.print(f"\n[bold]DESCRIPTION:[/]\n  {info['description']}")
    if info["fields"]:
        out.print("\n[bold]FIELDS:[/]")
        for f in info["fields"]:
            extra = " -required-" if f["required"] else f" (default {json.dumps(f['default'])})" \
                if "default" in f else ""
            out.print(f"  [bold]{f['name']}[/] <{f['type']}>{extra}\n    {f['description'] or '-'}")


def describe(ref: str = typer.Argument(..., help="KIND/NAME, e.g. pool/agents"),
             namespace: str | None = NAMESPACE) -> None:
    """Show one object: spec, status, conditions, recent events (and a pool's children)."""
    objects.describe(ref, namespace)


def delete(ref: str | None = typer.Argument(None, help="KIND/NAME"),
           files: list[str] = typer.Option([], "-f", "--filename", help="delete the objects in these files"),
           recursive: bool = RECURSIVE, sets: list[str] = SETS, values: list[Path] = VALUES,
           template: bool = TEMPLATE, namespace: str | None = NAMESPACE) -> None:
    """Delete objects (by KIND/NAME or by the files that declare them). Their children and snapshots are
    released by the reconciler; a pool's claimed children stay until killed or their ttl ends; a ForkClaim's
    children are killed."""
    from forkd.client import parse_ref

    if ref:
        kind, name = parse_ref(ref)
        targets = [(kind, _ns(namespace), name)]
    elif files:
        targets = [(o.kind, o.metadata.namespace, o.metadata.name)
                   for o, _ in _load(files, recursive, sets, values, template, namespace)]
    else:
        raise typer.BadParameter("name KIND/NAME or pass -f FILE")
    b = backend()
    for kind, ns, name in targets:
        b.delete(kind, qname(ns, name))
        out.print(f"{kind}/{_shown({'name': name, 'namespace': ns})} deleted")


def _when(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def claim(pool: str = typer.Argument(..., help="the ForkPool", autocompletion=complete_pools),
          n: int = count_option(1, "how many children"),
          lifetime: str | None = lifetime_option("each claimed child is killed this long after the claim "
                                                   "(default: the pool's child.ttlSeconds, else "
                                                   "FORKD_SANDBOX_TIMEOUT); extend it with forkd set-timeout"),
          output: Fmt = typer.Option(Fmt.table, "-o", "--output"),
          namespace: str | None = typer.Option(None, "--namespace", help="the pool's namespace (default: default)"),
          n_flag: str | None = typer.Option(None, "-n", metavar="NAMESPACE", help="the pool's namespace; a number "
                                            "is the old spelling of --count (warned)")) -> None:
    """Hand out N warm children of a pool at once; the pool refills in the background."""
    if n_flag is not None and n_flag.isdigit():  # `claim POOL -n 2` meant a count before -n meant a namespace
        n, n_flag = count(n, int(n_flag)), None
    t0 = time.perf_counter()
    recs = backend().claim(qname(_ns(namespace or n_flag), pool), n, lifetime)
    took = (time.perf_counter() - t0) * 1000.0
    data = [{"id": r["id"], "pool": pool, "snapshot": r["snapshot"], "agent_socket": r["agent_socket"],
             "expires_at": r.get("expires_at")} for r in recs]
    if output == Fmt.json:
        print(json.dumps({"children": data, "claim_ms": took}, indent=2))
        return
    emit({"children": data, "claim_ms": took}, output,
         [("ID", "left"), ("SNAPSHOT", "left"), ("EXPIRES AT", "left"), ("AGENT SOCKET", "left")],
         [[d["id"], d["snapshot"], _when(d["expires_at"]), d["agent_socket"] or "- (on the daemon's host)"]
          for d in data])
    if output == Fmt.table:
        out.print(f"claimed {len(data)} in {took:.1f} ms; use: forkd exec ID -- CMD, forkd eval ID EXPR")
