"""Benchmark: spawn-to-first-answer with `network: isolated` vs `none`, and the cost of one network namespace.

    FORKD_HOME=/tmp/fkb python3 bench/isolation.py [--n 10] [--memory-limit-mib 256] [--json]

Builds (once) two 512 MiB parents, `bench-none` and `bench-iso` (network isolated), then forks one child at a time
from each, alternating, and times fork() from call to the child's agent answering ("ready"); every child gets
a cgroup in both modes (memory limit, CPU weight), so the ratio isolates the network namespace. Separately it
times netns.setup() + teardown() alone. Target: isolated / none <= 1.2 (p50).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from forkd.base.errors import ForkdError
from forkd.core.requests import ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.sandbox import netns


def ensure(rt: Runtime, tag: str, network: str) -> None:
    try:
        if rt.store.get(tag).status == "ready":
            return
        rt.rmi(tag, force=True)
    except ForkdError:
        pass
    rt.create_snapshot(ParentBuild.of(tag=tag, memory_mib=512, network=network))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--memory-limit-mib", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rt = Runtime()
    ensure(rt, "bench-none", "none")
    ensure(rt, "bench-iso", "isolated")
    ready: dict[str, list[float]] = {"none": [], "isolated": []}
    net_ms: list[float] = []
    for tag in ("bench-none", "bench-iso"):  # warm-up: first fork per process pays imports and the bridge
        rt.kill([r.id for r in rt.fork(Spawn.of(tag=tag, n=1, memory_limit_mib=a.memory_limit_mib))])
    for _ in range(a.n):
        for tag, mode in (("bench-none", "none"), ("bench-iso", "isolated")):
            t0 = time.perf_counter()
            (rec,) = rt.fork(Spawn.of(tag=tag, n=1, memory_limit_mib=a.memory_limit_mib))
            rt.ping(rec.id)
            ready[mode].append((time.perf_counter() - t0) * 1000.0)
            if mode == "isolated":
                net_ms.append(rec.timings_ms.get("net_total", 0.0))
            rt.kill([rec.id])
    setup, teardown = [], []
    for i in range(a.n):
        t0 = time.perf_counter()
        net, _ = netns.setup(f"cbench{i:06d}", str(rt.layout.home))
        t1 = time.perf_counter()
        netns.teardown(net)
        setup.append((t1 - t0) * 1000.0)
        teardown.append((time.perf_counter() - t1) * 1000.0)
    p50n, p50i = statistics.median(ready["none"]), statistics.median(ready["isolated"])
    res = {
        "n": a.n,
        "spawn_to_answer_ms": {m: {"p50": statistics.median(v), "p90": pct(v, 0.9), "min": min(v)}
                               for m, v in ready.items()},
        "ratio_p50_isolated_over_none": p50i / p50n,
        "netns_setup_in_spawn_ms_p50": statistics.median(net_ms),
        "netns_setup_alone_ms": {"p50": statistics.median(setup), "p90": pct(setup, 0.9)},
        "netns_teardown_ms": {"p50": statistics.median(teardown), "p90": pct(teardown, 0.9)},
    }
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for m, v in res["spawn_to_answer_ms"].items():
        print(f"spawn-to-first-answer {m:9s} p50 {v['p50']:7.1f} ms  p90 {v['p90']:7.1f}  min {v['min']:7.1f}")
    print(f"ratio isolated/none (p50): {res['ratio_p50_isolated_over_none']:.2f}  (target <= 1.2)")
    print(f"namespace setup inside a spawn p50 {res['netns_setup_in_spawn_ms_p50']:.1f} ms; alone p50 "
          f"{res['netns_setup_alone_ms']['p50']:.1f} ms, teardown p50 {res['netns_teardown_ms']['p50']:.1f} ms")


if __name__ == "__main__":
    main()
