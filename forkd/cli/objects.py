"""Reading declarative objects, without typer: `forkd get` and `forkd describe` (forkd.cli.direct runs them before
the command tree is built; forkd.cli.declarative declares them). Through a daemon the objects stay the documents it
sends, named by forkd.spec.kinds: no models are loaded."""

from __future__ import annotations

import calendar
import sys
import time

from forkd.base.errors import InvalidInput
from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, emit, out
from forkd.spec.namespaces import DEFAULT, check_namespace, qname

GET_OUTPUTS = ("table", "wide", "yaml", "json")  # forkd.cli.declarative.GetOut


def _ns(namespace: str | None) -> str:
    return check_namespace(namespace) if namespace is not None else DEFAULT


def get(resource: str, name: str | None = None, output: str | None = None, namespace: str | None = None,
        all_namespaces: bool = False) -> None:
    """`forkd get`: RESOURCE (a kind's word) [NAME], or KIND/NAME."""
    from forkd.client import parse_ref, resolve_kind

    kind, name = parse_ref(resource) if "/" in resource and name is None else (resolve_kind(resource), name)
    if all_namespaces and name:
        raise InvalidInput("-A lists objects: it takes no NAME", hint="name one with -n NAMESPACE instead of -A")
    ns = _ns(namespace)
    docs = _documents(backend().get(kind, qname(ns, name) if name else None))
    docs = [d for d in docs if all_namespaces or name or d["metadata"].get("namespace", DEFAULT) == ns]
    output = output or "table"
    if output in ("json", "yaml"):
        data = docs[0] if name else {"apiVersion": "v1", "kind": "List", "items": docs}
        emit(data, Fmt(output))
        return
    wide = output == "wide"
    emit(docs, Fmt.table, _columns(kind, wide, all_namespaces), [_row(kind, d, wide, all_namespaces) for d in docs])


def describe(ref: str, namespace: str | None = None) -> None:
    """`forkd describe KIND/NAME`."""
    import yaml

    from forkd.client import parse_ref

    kind, name = parse_ref(ref)
    info = backend().describe(kind, qname(_ns(namespace), name))
    doc = info["object"]
    out.print(f"[bold]{kind}/{name}[/]  generation {doc['metadata'].get('generation')}  "
              f"age {_age(doc['metadata'].get('creationTimestamp'))}  "
              f"source {info.get('source') or '-'}")
    sys.stdout.write(yaml.safe_dump({"spec": doc["spec"]}, sort_keys=False))
    st = doc.get("status") or {}
    nums = {k: v for k, v in st.items() if k != "conditions"}
    if nums:
        sys.stdout.write(yaml.safe_dump({"status": nums}, sort_keys=False))
    emit(None, Fmt.table, [("CONDITION", "left"), ("STATUS", "left"), ("REASON", "left"), ("SINCE", "left"),
                           ("MESSAGE", "left")],
         [[c["type"], c["status"], c.get("reason", ""), c.get("lastTransitionTime", ""), c.get("message", "")]
          for c in st.get("conditions", [])])
    if info.get("children") is not None:
        out.print(f"children: {len(info['children'])}")
        for c in info["children"]:
            out.print(f"  {c['id']}  {c['status']}  {'claimed' if c['claimed'] else 'idle'}  {c['snapshot']}")
    out.print("events:")
    for e in info.get("events", [])[-10:]:
        when = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        out.print(f"  {when}  {e['type']:<7} {e['reason']:<14} {e['message']}")


def _age(ts: str | None) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d ("-" for an object stored before forkd recorded creationTimestamp)."""
    if not ts:
        return "-"
    secs = max(0.0, time.time() - calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")))
    for limit, unit, div in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if secs < limit:
            return f"{int(secs // div)}{unit}"
    return f"{int(secs // 86400)}d"


def _ready(doc: dict) -> tuple[str, str]:
    for c in (doc.get("status") or {}).get("conditions", []):
        if c["type"] == "Ready":
            return c["status"], c.get("reason", "")
    return "Unknown", ""


def _columns(kind: str, wide: bool, all_ns: bool = False) -> list[tuple[str, str]]:
    cols = [("NAMESPACE", "left")] * all_ns + [("NAME", "left"), ("READY", "left")]
    if kind == "ForkPool":
        cols += [("WARM", "right"), ("TARGET", "right"), ("CLAIMED", "right"), ("DEPTH", "right"),
                 ("SPAWN-P50", "right")]
    elif kind == "ForkClaim":
        cols += [("POOL", "left"), ("CLAIMED", "right"), ("EXPIRES", "left")]
    else:
        cols += [("SNAPSHOT", "left")]
    return cols + [("GEN", "right"), ("AGE", "right")] + ([("REASON", "left"), ("SOURCE", "left")] if wide else [])


def _row(kind: str, d: dict, wide: bool, all_ns: bool = False) -> list[str]:
    st, meta = d.get("status") or {}, d["metadata"]
    ready, reason = _ready(d)
    row = [meta.get("namespace", DEFAULT)] * all_ns + [meta["name"], ready]
    if kind == "ForkPool":
        p50 = st.get("spawnP50Ms")
        row += [str(st.get("warm", 0)), str(d["spec"].get("warm", 0)), str(st.get("claimed", 0)),
                str(st.get("chainDepth", 0)), f"{p50:.0f}ms" if p50 else "-"]
    elif kind == "ForkClaim":
        row += [d["spec"]["pool"], f"{st.get('claimed', 0)}/{d['spec'].get('count', 1)}", st.get("expiresAt") or "-"]
    else:
        row += [st.get("snapshot") or "-"]
    row += [str(meta.get("generation", 0)), _age(meta.get("creationTimestamp"))]
    if wide:
        row += [reason, d["spec"].get("from") or d["spec"].get("pool") or ""]
    return row


def _documents(objs: list) -> list[dict]:
    """Objects as documents: a daemon's answer already is (RemoteBackend's `plain`), an in-process one is models."""
    if all(isinstance(o, dict) for o in objs):
        return objs
    from forkd.spec.models import to_document

    return [to_document(o) for o in objs]
