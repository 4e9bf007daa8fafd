#!/usr/bin/env python3
"""API benchmark, in one run against a real daemon (TCP loopback with a bearer token) and real VMs:

    python3 bench/api.py [--home DIR] [--calls 50] [-o json]

1. exec round trip (`true`) through REST (POST /v1/sandboxes/{id}/exec) vs a direct agent call on the child's
   virtio-serial socket, p50/p90 of each and the ratio;
2. 100 concurrent requests (eval) spread over 10 children, 20 client threads: p50/p99 latency and requests/s;
3. claim of 10 children from a warm pool of 10 through the API (POST /v1/pools/{name}/claim).

The daemon it starts allows CONCURRENT_THREADS guest calls in flight per child (FORKD_GUEST_IO_PER_CHILD, set for
that daemon only): with 20 threads over 10 children, a slow child can hold more calls than the shipped cap of 8, and
the daemon would refuse them (Busy) where an older daemon without the cap served them. So step 2 measures the same
100 evals on every commit; a commit without the setting ignores the variable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.base.errors import ForkdError  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core.requests import ParentBuild  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.reconciler.control import Control  # noqa: E402
from forkd.sdk import Controller  # noqa: E402

TAG = "bench-api"
POOL = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "bench-api-pool"},
        "spec": {"from": "bench-api-parent", "warm": 10, "maxChildren": 40}}
PARENT = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkParent", "metadata": {"name": "bench-api-parent"},
          "spec": {"memoryMiB": 256}}
CONCURRENT_THREADS = 20  # client threads of step 2: also the guest calls per child its daemon allows


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon_env(home: str) -> dict[str, str]:
    """The environment of the daemon this benchmark starts: its home, and a per-child cap of guest calls that step
    2's threads cannot reach (so no eval is refused for the cap)."""
    return dict(os.environ, FORKD_HOME=home, FORKD_GUEST_IO_PER_CHILD=str(CONCURRENT_THREADS))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=str(settings().home))
    ap.add_argument("--calls", type=int, default=50, help="sequential exec calls per path")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    rt = Runtime(Layout(Path(args.home)))
    try:
        rt.store.get_ready(TAG)
    except ForkdError:
        log(f"creating snapshot {TAG} (256 MiB)")
        rt.create_snapshot(ParentBuild.of(tag=TAG, memory_mib=256))
    port = free_port()
    token_file = Path(tempfile.mkdtemp(prefix="fkapi")) / "token"
    log_path = token_file.parent / "daemon.log"
    daemon = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--bind", f"127.0.0.1:{port}",
                               "--token-file", str(token_file), "--interval", "0.5"],
                              env=daemon_env(args.home), stdout=open(log_path, "ab"),
                              stderr=subprocess.STDOUT)
    res: dict = {}
    ids: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not token_file.exists() or not rt.layout.daemon_socket.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("daemon did not start:\n" + log_path.read_text()[-2000:])
            time.sleep(0.05)
        time.sleep(0.5)
        c = Controller(url=f"http://127.0.0.1:{port}", token=token_file.read_text().strip())
        log("spawning 10 children through the API")
        ids = [s["id"] for s in c.spawn_sandboxes(TAG, n=10)]

        rest, direct = [], []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            r = c.exec_command(ids[0], ["true"])
            rest.append((time.perf_counter() - t0) * 1000)
            assert r["exit_code"] == 0
            t0 = time.perf_counter()
            with rt.agent(ids[0]) as a:
                a.exec(["true"])
            direct.append((time.perf_counter() - t0) * 1000)
        res["exec_rest_ms"] = {"p50": statistics.median(rest), "p90": pct(rest, 90)}
        res["exec_direct_ms"] = {"p50": statistics.median(direct), "p90": pct(direct, 90)}
        res["exec_ratio"] = res["exec_rest_ms"]["p50"] / res["exec_direct_ms"]["p50"]

        log("100 concurrent evals over 10 children")

        def one(i: int) -> float:
            t0 = time.perf_counter()
            r = c.eval_code(ids[i % 10], f"{i} * 2")
            assert r["result"] == str(i * 2), r
            return (time.perf_counter() - t0) * 1000

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=CONCURRENT_THREADS) as pool:
            lat = list(pool.map(one, range(100)))
        wall = time.perf_counter() - t0
        res["concurrent_100"] = {"p50": statistics.median(lat), "p99": pct(lat, 99), "per_s": 100 / wall,
                                 "threads": CONCURRENT_THREADS, "guest_io_per_child": CONCURRENT_THREADS}

        log("claim of 10 from a warm pool of 10")
        c.apply([PARENT, POOL], applyset="bench-api")
        c.wait([("ForkParent", "bench-api-parent"), ("ForkPool", "bench-api-pool")], timeout=600)
        t0 = time.perf_counter()
        got = c.claim("bench-api-pool", 10)
        res["claim_10_ms"] = (time.perf_counter() - t0) * 1000
        assert len(got) == 10
        ids += [g["id"] for g in got]
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=120)  # a loaded host can take longer than a quiet one to stop a daemon
        except subprocess.TimeoutExpired:
            log("the daemon did not stop within 120 s of SIGTERM: killed")
            daemon.kill()
            daemon.wait()
        mine = [i for i in ids if (rt.layout.children / i).exists()]
        if mine:
            rt.kill(mine)
        for kind, name in (("ForkPool", "bench-api-pool"), ("ForkParent", "bench-api-parent")):
            try:
                Control(rt).delete(kind, name)
            except ForkdError:
                pass
        left = [r.id for r in rt.children() if r.pool == "bench-api-pool"]
        if left:
            rt.kill(left)
    shutil.rmtree(token_file.parent, ignore_errors=True)  # its token and daemon log: kept only when the run failed
    if args.output == "json":
        print(json.dumps(res, indent=2))
        return 0
    e, d, cc = res["exec_rest_ms"], res["exec_direct_ms"], res["concurrent_100"]
    print("forkd API benchmark (TCP loopback + bearer token, TCG, 2 cores)")
    print(f"  exec `true` via REST        p50 {e['p50']:6.1f} ms  p90 {e['p90']:6.1f} ms")
    print(f"  exec `true` direct to agent p50 {d['p50']:6.1f} ms  p90 {d['p90']:6.1f} ms")
    print(f"  >>> REST / direct = {res['exec_ratio']:.2f}x")
    print(f"  100 concurrent evals over 10 children: p50 {cc['p50']:.1f} ms  p99 {cc['p99']:.1f} ms  "
          f"{cc['per_s']:.0f} req/s  ({CONCURRENT_THREADS} threads; the daemon's FORKD_GUEST_IO_PER_CHILD set to "
          f"{CONCURRENT_THREADS})")
    print(f"  claim of 10 from a warm pool through the API: {res['claim_10_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
