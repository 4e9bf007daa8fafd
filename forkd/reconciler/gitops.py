"""Directory sync for `forkd serve --watch DIR`: apply every spec file in DIR, pruning within that directory.

A file that does not load changes nothing: its objects keep their last applied state, get a Warning event
with the error, and are not pruned. Valid files are applied as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forkd.reconciler.control import Change, Control, applyset_id
from forkd.reconciler.objects import key
from forkd.spec.loader import SpecLoadError, collect_files, load_paths


@dataclass
class SyncReport:
    changes: list[Change] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # file -> error text


def sync_directory(control: Control, directory: Path) -> SyncReport:
    directory = directory.resolve()
    applyset = applyset_id([str(directory)])
    report = SyncReport()
    objs, bad_files = [], set()
    for f in collect_files([directory], recursive=True):
        try:
            objs += [(item.obj, f"{item.file}:{item.line}") for item in load_paths([f])]
        except SpecLoadError as exc:
            report.errors[str(f)] = str(exc)
            bad_files.add(str(f))
    # objects earlier applied from a bad file are kept as they are (not pruned), and told why
    for st in control.objects.list():
        src = (st.source or "").rsplit(":", 1)[0]
        if st.applyset == applyset and src in bad_files:
            objs.append((st.obj.model_copy(update={"status": None}), st.source))
            control.objects.event(st.obj.kind, key(st.obj), "InvalidSpec",
                                  f"{src} does not load; keeping the last applied spec: "
                                  f"{report.errors[src].splitlines()[0]}", type_="Warning")
    names = {(o.kind, key(o)) for o, _ in objs}
    if len(names) != len(objs):
        objs = list({(o.kind, key(o)): (o, s) for o, s in objs}.values())
    report.changes = control.apply(objs, applyset, prune=True)
    return report
