#!/usr/bin/env python3
"""Pool benchmark, in one run against real VMs (plus plan() on 1,000 objects, no VMs):

    python3 bench/pool.py [--home DIR] [--claims 20] [-o json]

1. claim latency for one child from a warm pool: the core call (`Control.claim`) and the same claim through a
   running daemon's unix socket (HTTP), p50/p90; each claimed child is checked to answer a ping afterwards
   (untimed), and the pool is refilled before the next claim;
2. hand out 32 children at once from a pool of 32 warm (one claim of 32);
3. time until the pool is back at target after claiming 10 (reconcile loop refilling);
4. plan() p50 over 1,000 objects (bench/plan.py's world).
Targets: claim p50 <= 1 ms, 32 handed out in <= 10 ms, plan() <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plan import timed, world  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.client.backends import RemoteBackend  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.reconciler.control import Control  # noqa: E402
from forkd.reconciler.plan import plan  # noqa: E402
from forkd.spec.loader import load_text  # noqa: E402

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {{name: bench-pool-parent}}
spec: {{memoryMiB: 256, warmup: {{imports: [json, decimal]}}}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: bench-pool}}
spec: {{from: bench-pool-parent, warm: {warm}, maxChildren: 80}}
"""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def apply(control: Control, warm: int) -> None:
    loaded, errors = load_text(SPEC.format(warm=warm), "bench-pool.yaml")
    assert not errors, errors
    control.apply([(x.obj, "bench") for x in loaded], "bench-pool")


def idle(rt: Runtime) -> int:
    return sum(1 for r in rt.children() if r.pool == "bench-pool" and r.status == "running" and not r.claimed)


def refill(control: Control, timeout: float = 300) -> float:
    t0 = time.perf_counter()
    ok, problems = control.reconciler.run_until_converged(timeout, [("ForkPool", "bench-pool")])
    if not ok:
        raise SystemExit(f"pool did not converge: {problems}")
    return time.perf_counter() - t0


def claim_series(claim, rt: Runtime, control: Control, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        got = claim()
        samples.append((time.perf_counter() - t0) * 1000)
        cid = got[0].id if hasattr(got[0], "id") else got[0]["id"]
        assert rt.ping(cid)["child_id"] == cid  # the handed-out child answers (not timed)
        rt.kill([cid])
        refill(control)
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=str(settings().home))
    ap.add_argument("--claims", type=int, default=20)
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    os.environ["FORKD_HOME"] = args.home
    rt = Runtime(Layout(Path(args.home)))
    control = Control(rt)
    res: dict = {}
    daemon = None
    try:
        log("building the parent and a pool of 4")
        apply(control, 4)
        refill(control)
        log(f"{args.claims} single claims in-process")
        core = claim_series(lambda: control.claim("bench-pool", 1), rt, control, args.claims)
        res["claim_core_ms"] = {"p50": statistics.median(core), "p90": pct(core, 90)}

        log("starting a daemon for claims over its socket")
        daemon = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "0.5"],
                                  env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not rt.layout.daemon_socket.exists():
            time.sleep(0.05)
        time.sleep(0.5)
        remote = RemoteBackend(str(rt.layout.daemon_socket))
        remote.claim("bench-pool", 1)  # warm up the HTTP path once
        api = []
        for _ in range(args.claims):
            while idle(rt) < 4:
                time.sleep(0.05)
            t0 = time.perf_counter()
            got = remote.claim("bench-pool", 1)
            api.append((time.perf_counter() - t0) * 1000)
            assert rt.ping(got[0]["id"])["child_id"] == got[0]["id"]
        res["claim_api_ms"] = {"p50": statistics.median(api), "p90": pct(api, 90)}
        daemon.terminate()
        daemon.wait()
        daemon = None
        rt.kill([r.id for r in rt.children() if r.pool == "bench-pool" and r.claimed])

        log("scaling the pool to 32 warm")
        apply(control, 32)
        res["fill_32_s"] = refill(control)
        t0 = time.perf_counter()
        got = control.claim("bench-pool", 32)
        res["hand_out_32_ms"] = (time.perf_counter() - t0) * 1000
        assert len(got) == 32 and all(rt.ping(r.id)["child_id"] == r.id for r in got)
        rt.kill([r.id for r in got])
        refill(control)

        log("claiming 10 and timing the refill")
        got = control.claim("bench-pool", 10)
        res["back_at_target_after_10_s"] = refill(control)
        rt.kill([r.id for r in got])

        desired, actual = world()
        res["plan_1000_objects_ms"] = statistics.median(timed(lambda: plan(desired, actual), 20))
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait()
        for kind, name in (("ForkPool", "bench-pool"), ("ForkParent", "bench-pool-parent")):
            try:
                control.delete(kind, name)
            except Exception:  # noqa: BLE001 - best effort clean-up
                pass
        control.reconciler.run_until_converged(60)
        left = [r.id for r in rt.children() if r.pool == "bench-pool"]
        if left:
            rt.kill(left)
        control.reconciler.close()

    if args.output == "json":
        print(json.dumps(res, indent=2))
        return 0
    verdict = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    print("forkd pool benchmark (TCG, 2 cores, 256 MiB children)")
    core, api = res["claim_core_ms"], res["claim_api_ms"]
    print(f"  claim one, core call       p50 {core['p50']:7.2f} ms  p90 {core['p90']:7.2f} ms"
          f"   target p50 <= 1 ms: {verdict(core['p50'] <= 1)}")
    print(f"  claim one, via daemon API  p50 {api['p50']:7.2f} ms  p90 {api['p90']:7.2f} ms")
    print(f"  hand out 32 from a pool of 32: {res['hand_out_32_ms']:7.2f} ms"
          f"   target <= 10 ms: {verdict(res['hand_out_32_ms'] <= 10)}")
    print(f"  fill an empty pool to 32 warm: {res['fill_32_s']:.1f} s")
    print(f"  back at target after claiming 10: {res['back_at_target_after_10_s']:.2f} s")
    print(f"  plan() over 1,000 objects p50: {res['plan_1000_objects_ms']:.1f} ms"
          f"   target <= 50 ms: {verdict(res['plan_1000_objects_ms'] <= 50)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
