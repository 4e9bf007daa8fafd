"""The README's main job: apply a spec file (a parent + a pool), wait until the pool is warm, claim N
children, run an eval and an exec in each, and report ids and timings."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from forkd.base.errors import ForkdError, InvalidInput
from forkd.client.backends import Backend
from forkd.reconciler.control import applyset_id
from forkd.spec.loader import load_paths

EVAL = "json.dumps({'sum': str(decimal.Decimal('0.1') + decimal.Decimal('0.2'))})"
EXEC = ["/bin/sh", "-c", "echo $(hostname) $(ls -d /srv/work)"]


def run_quickstart(backend: Backend, spec: Path, n: int, keep: bool,
                   progress: Callable[[str], None]) -> dict:
    loaded = load_paths([spec])
    objs = [(x.obj, f"{x.file}:{x.line}") for x in loaded]
    pools = [o.metadata.name for o, _ in objs if o.kind == "ForkPool"]
    if not pools:
        raise InvalidInput(f"{spec} declares no ForkPool")
    pool = pools[0]
    t0 = time.perf_counter()
    backend.apply(objs, applyset_id([str(spec.resolve())]))
    ok, problems = backend.wait([(o.kind, o.metadata.name) for o, _ in objs], 600, progress)
    if not ok:
        raise ForkdError("the spec did not become Ready: " + "; ".join(problems))
    ready_s = time.perf_counter() - t0
    progress(f"pool {pool!r} is warm; claiming {n}")
    t1 = time.perf_counter()
    children = backend.claim(pool, n)
    claim_ms = (time.perf_counter() - t1) * 1000.0
    rows = []
    try:
        for c in children:
            t2 = time.perf_counter()
            ev = backend.eval(c["id"], EVAL)
            t3 = time.perf_counter()
            ex = backend.exec(c["id"], EXEC)
            t4 = time.perf_counter()
            rows.append({"id": c["id"], "snapshot": c["snapshot"], "eval_ms": (t3 - t2) * 1000.0,
                         "eval": ev["value"] if not ev["error"] else ev["error"]["message"],
                         "exec_ms": (t4 - t3) * 1000.0, "exec_stdout": ex["stdout"].strip(),
                         "exec_exit_code": ex["exit_code"]})
    finally:
        if not keep:
            backend.kill([c["id"] for c in children])
    return {"pool": pool, "ready_s": ready_s, "claim_ms": claim_ms, "children": rows, "kept": keep}
