"""The README's main job: image -> warm snapshot -> fork N children -> an eval and an exec in each."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from forkd.base.errors import NotFound

if TYPE_CHECKING:
    from forkd.core.runtime import Progress, Runtime

WARM_IMPORTS = ("json", "decimal", "hashlib", "sqlite3")
WARM_RUN = ("mkdir -p /srv/work && echo warmed > /srv/work/state",)


def run_quickstart(rt: Runtime, tag: str, n: int, keep: bool, progress: Progress) -> dict:
    rt.build_image(progress)
    reused = False
    try:
        snap = rt.store.get_ready(tag)
        reused = tuple(snap.warm_imports) == WARM_IMPORTS and tuple(snap.warm_run) == WARM_RUN
        if not reused:
            rt.kill(tag=tag)
            rt.rmi(tag)
    except NotFound:
        pass
    except Exception:  # not ready / failed: start over
        rt.kill(tag=tag)
        rt.rmi(tag, force=True)
    if not reused:
        snap = rt.create_snapshot(tag, warm_imports=WARM_IMPORTS, warm_run=WARM_RUN, progress=progress)
    progress(f"forking {n} children of {tag!r}")
    t0 = time.perf_counter()
    recs = rt.fork(tag, n, progress=progress)
    fork_ms = (time.perf_counter() - t0) * 1000.0
    rows = []
    try:
        for r in recs:
            with rt.agent(r.id) as a:
                t1 = time.perf_counter()
                ev = a.eval("(json.dumps({'sum': str(decimal.Decimal('0.1') + decimal.Decimal('0.2'))}))")
                t2 = time.perf_counter()
                ex = a.exec(["/bin/sh", "-c", "echo $(hostname) $(cat /srv/work/state)"])
                t3 = time.perf_counter()
            rows.append({"id": r.id, "ready_ms": r.timings_ms.get("ready"), "eval_ms": (t2 - t1) * 1000.0,
                         "eval": ev["value"] if not ev["error"] else ev["error"]["message"],
                         "exec_ms": (t3 - t2) * 1000.0, "exec_stdout": ex["stdout"].strip(),
                         "exec_exit_code": ex["exit_code"]})
    finally:
        if not keep:
            rt.kill([r.id for r in recs])
    return {"snapshot": tag, "snapshot_reused": reused, "parent_ms": snap.timings_ms.get("boot", 0)
            + snap.timings_ms.get("warmup", 0), "fork_ms": fork_ms, "children": rows, "kept": keep}
