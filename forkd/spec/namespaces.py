"""Namespaces of declarative objects, as in Kubernetes: an object is known by kind, namespace and name.

The reconciler plans over *qualified* names, so that nothing it makes on the node collides across namespaces:
"<name>" in the namespace "default" (today's names: nothing existing changes) and "<namespace>.<name>" in any
other. Neither a name nor a namespace may contain '.', so a qualified name splits back unambiguously. The snapshot
tags, the pool of children and the claim records the reconciler makes all start with the qualified name.

References inside a spec (a pool's or layer's `from`, a claim's `pool` and `from`, a branch's `pool/<name>`)
name objects of the object's own namespace, in every namespace, "default" included: each is a plain name, which
`qualify` rewrites with the object's namespace; one that is not (a qualified "team-b.agents", a path) is refused
(`check_references`), never passed through. A branch's raw child id resolves against the children of its own
namespace (forkd.reconciler.world.child_namespaces). Pure: no I/O.
"""

from __future__ import annotations

import re

from forkd.base.errors import InvalidInput
from forkd.base.names import NAME_PATTERN

DEFAULT = "default"
NAMESPACE_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # a DNS label, as Kubernetes namespaces
_NS_RE = re.compile(NAMESPACE_PATTERN)
_NAME_RE = re.compile(NAME_PATTERN)
POOL_PREFIX = "pool/"  # a ForkBranch's spec.sandbox: pool/<name> of a ForkPool, else a child id


def check_namespace(ns: str) -> str:
    if not isinstance(ns, str) or not _NS_RE.match(ns):
        raise InvalidInput(f"invalid namespace {ns!r}",
                           hint="use 1-63 characters: lowercase letters, digits or '-', starting and ending with a "
                                "letter or digit")
    return ns


def qname(namespace: str | None, name: str) -> str:
    """The qualified name of `name` in `namespace`: "name" in "default" (or None), else "namespace.name"."""
    return name if not namespace or namespace == DEFAULT else f"{namespace}.{name}"


def split_qname(qualified: str) -> tuple[str, str]:
    """"ns.name" -> ("ns", "name"); "name" -> ("default", "name")."""
    ns, dot, name = qualified.partition(".")
    return (ns, name) if dot else (DEFAULT, qualified)


def references(obj) -> list[tuple[str, str, str, str]]:
    """(field, value as written, the name in it, the kinds it must name) of every reference in `obj`'s spec."""
    spec = obj.spec
    if obj.kind in ("ForkLayer", "ForkPool"):
        return [("spec.from", spec.from_, spec.from_, "ForkParent, ForkLayer or ForkBranch")]
    if obj.kind == "ForkClaim":
        return [("spec.pool", spec.pool, spec.pool, "ForkPool")] + (
            [("spec.from", spec.from_, spec.from_, "ForkBranch")] if spec.from_ is not None else [])
    if obj.kind == "ForkBranch" and "/" in spec.sandbox:  # pool/<name>; a child id has no '/'
        return [("spec.sandbox", spec.sandbox, spec.sandbox.removeprefix(POOL_PREFIX), "ForkPool")]
    return []


def check_references(obj) -> None:
    """Refuse (InvalidInput naming the object, field and namespace) a reference that is not the plain name of an
    object of `obj`'s own namespace: nothing names across namespaces, from "default" neither."""
    ns = obj.metadata.namespace
    for field, written, name, what in references(obj):
        if not _NAME_RE.match(name):
            form = "pool/<name> (or a child id)" if field == "spec.sandbox" else "<name>"
            raise InvalidInput(
                f"{obj.kind}/{obj.metadata.name} in namespace {ns}: {field} {written!r} does not name a {what} of "
                f"namespace {ns}",
                hint=f"references resolve in the object's own namespace: write {field} as {form}, with the plain "
                     f"name (no 'namespace.' prefix, no '/') of a {what} of namespace {ns}; an object of another "
                     f"namespace cannot be referenced")


def qualify(obj):
    """`obj` with its name and the references in its spec qualified by its namespace (InvalidInput, from
    `check_references`, for a reference that is not a plain name)."""
    check_references(obj)
    ns = obj.metadata.namespace
    if ns == DEFAULT:
        return obj  # qname("default", x) is x: its name and its (checked) references are already qualified
    spec = obj.spec
    update: dict = {}
    if obj.kind in ("ForkLayer", "ForkPool"):
        update["from_"] = qname(ns, spec.from_)
    elif obj.kind == "ForkClaim":
        update["pool"] = qname(ns, spec.pool)
        if spec.from_ is not None:
            update["from_"] = qname(ns, spec.from_)
    elif obj.kind == "ForkBranch" and spec.sandbox.startswith(POOL_PREFIX):
        update["sandbox"] = POOL_PREFIX + qname(ns, spec.sandbox.removeprefix(POOL_PREFIX))
    meta = obj.metadata.model_copy(update={"name": qname(ns, obj.metadata.name)})
    return obj.model_copy(update={"metadata": meta, "spec": spec.model_copy(update=update)})
