"""The verbs that only read: `forkd ls`, `forkd snapshot ls` and `forkd config`, without typer (forkd.cli.direct
runs them before the command tree is built; forkd.cli.main and forkd.cli.config declare them). Through a daemon they
read through forkd.cli.daemon's backend(), else in-process."""

from __future__ import annotations

import time

from forkd.cli.daemon import backend
from forkd.cli.output import Fmt, emit, ms, size

CHILD_COLUMNS = [("ID", "left"), ("STATUS", "left"), ("RESIDENCY", "left"), ("SNAPSHOT", "left"), ("POOL", "left"),
                 ("CLAIM", "left"), ("PID", "right"), ("RESTORE ms", "right"), ("READY ms", "right")]
SNAPSHOT_COLUMNS = [("TAG", "left"), ("STATUS", "left"), ("MiB", "right"), ("ACCEL", "left"), ("STORED", "right"),
                    ("DISK", "right"), ("CREATED", "left")]


def children(label: list[str] | None = None, output: str = Fmt.table) -> None:
    """`forkd ls`: the children (only those with every label k=v or key k in `label`)."""
    recs = backend().children(label) if label else backend().children()
    emit(recs, Fmt(output or Fmt.table), CHILD_COLUMNS, child_rows(recs))


def snapshots(output: str = Fmt.table) -> None:
    """`forkd snapshot ls`: every snapshot's view, a corrupt one named by its directory, with why."""
    data = backend().snapshots()
    rows = []
    for s in data:
        if s.corrupt:
            rows.append([s.tag, "corrupt", "-", "-", "-", "-", s.error or ""])
            continue
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at))
        rows.append([s.tag, s.status, str(s.memory_mib), s.accel or "-", size(s.memory_stored_bytes),
                     size(s.disk_bytes) if s.disk_sha256 else "-", created + (f"  {s.error}" if s.error else "")])
    emit(data, Fmt(output or Fmt.table), SNAPSHOT_COLUMNS, rows)


def settings(output: str | None = None) -> int:
    """`forkd config`: every setting, read without the settings model when every value set reads plainly
    (forkd.cli.settings_table); 2 when a value set does not parse."""
    from forkd.cli.settings_table import describe as plainly

    rows = plainly()
    if rows is None:
        from forkd.base.settings import describe

        rows = [r.__dict__ for r in describe()]
    colour = {"env": "cyan", "default": "dim", "invalid": "red"}
    emit(rows, Fmt(output or Fmt.table), [("NAME", "left"), ("VALUE", "left"), ("DEFAULT", "left"),
                                          ("SOURCE", "left"), ("DOC", "left")],
         [[r["name"], _cell(r["value"]), _cell(r["default"]), f"[{colour[r['source']]}]{r['source']}[/]", r["doc"]]
          for r in rows])
    return 2 if any(r["source"] == "invalid" for r in rows) else 0


def _cell(v: object) -> str:
    return "-" if v is None or v == "" else str(v)


def child_rows(recs: list[dict]) -> list[list[str]]:
    """A table row per child (CHILD_COLUMNS)."""
    return [[r["id"], r["status"] + (" (VMM stopped)" if r.get("vmm_stopped") else ""), _residency(r), r["snapshot"],
             r["pool"] or "-",
             "claimed" if r["claimed_at"] else "idle" if r["pool"] else "-", str(r["pid"] or "-"),
             ms(r["timings_ms"].get("restore")), ms(r["timings_ms"].get("ready"))] for r in recs]


def _residency(r: dict) -> str:
    """Where a running child's memory is (awake, paged, asleep), and how often a request woke it."""
    if r["status"] != "running":
        return "-"
    wakes = r.get("wakes") or 0
    return r.get("residency", "awake") + (f" (woke {wakes})" if wakes else "")
