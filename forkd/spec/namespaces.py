"""Namespaces of declarative objects, as in Kubernetes: an object is known by kind, namespace and name.

The reconciler plans over *qualified* names, so that nothing it makes on the node collides across namespaces:
"<name>" in the namespace "default" (today's names: nothing existing changes) and "<namespace>.<name>" in any
other. Neither a name nor a namespace may contain '.', so a qualified name splits back unambiguously. The snapshot
tags, the pool of children and the claim records the reconciler makes all start with the qualified name.
References inside a spec (a pool's or layer's `from`, a claim's `pool` and `from`, a branch's `pool/<name>`)
name objects of the same namespace: `qualify` rewrites them with the object's name. Pure: no I/O.
"""

from __future__ import annotations

import re

from forkd.base.errors import InvalidInput

DEFAULT = "default"
NAMESPACE_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # a DNS label, as Kubernetes namespaces
_NS_RE = re.compile(NAMESPACE_PATTERN)


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


def qualify(obj):
    """`obj` with its name and the references in its spec qualified by its namespace (itself in "default")."""
    ns = obj.metadata.namespace
    if ns == DEFAULT:
        return obj
    spec = obj.spec
    update: dict = {}
    if obj.kind in ("ForkLayer", "ForkPool"):
        update["from_"] = qname(ns, spec.from_)
    elif obj.kind == "ForkClaim":
        update["pool"] = qname(ns, spec.pool)
        if spec.from_ is not None:
            update["from_"] = qname(ns, spec.from_)
    elif obj.kind == "ForkBranch" and spec.sandbox.startswith("pool/"):
        update["sandbox"] = "pool/" + qname(ns, spec.sandbox.split("/", 1)[1])
    meta = obj.metadata.model_copy(update={"name": qname(ns, obj.metadata.name)})
    return obj.model_copy(update={"metadata": meta, "spec": spec.model_copy(update=update)})
