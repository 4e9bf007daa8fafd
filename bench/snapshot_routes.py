#!/usr/bin/env python3
"""Snapshot route latency, old URLs beside new ones, in one run against real daemons (TCP loopback, bearer token):

    python3 bench/snapshot_routes.py [--before DIR] [--snapshots 20] [--calls 200] [-o json] [--report]

Each daemon serves its own home holding the same `--snapshots` records (a base and a chain of layers on it, with
empty data files: the routes read records and the chain, never memory). The requests are interleaved round-robin
over every (daemon, route) pair, one keep-alive connection per daemon, so load from other sessions falls on all of
them alike. `--before DIR`: a checkout of the code before the change (e.g. `git worktree add --detach DIR main`),
run as a second daemon, so the previous release's routes are measured with their own handlers in the same run.
No VM boots: the VMM driver is the fake one (nothing here forks or builds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lib.reports import fmt, host_facts, percentile, write_report  # noqa: E402

SHA = "0" * 64
ROUTES = {  # name -> (path, what it stands for)
    "old list": ("/v1/manifests", "GET /v1/manifests"),
    "new list": ("/v1/snapshots", "GET /v1/snapshots"),
    "old info": ("/v1/manifests/{tag}", "GET /v1/manifests/{tag}"),
    "new info": ("/v1/snapshots/{tag}/info", "GET /v1/snapshots/{tag}/info"),
    "new get": ("/v1/snapshots/{tag}", "GET /v1/snapshots/{tag}"),
}


def make_home(home: Path, n: int) -> str:
    """`n` ready records, `s0` a base and each next one a layer on the one before; the head's tag."""
    snaps = home / "snapshots"
    for i in range(n):
        d = snaps / f"s{i}"
        d.mkdir(parents=True)
        rec = {"tag": f"s{i}", "status": "ready", "created_at": time.time(), "memory_mib": 256, "vcpus": 1,
               "accel": "tcg", "image_id": "img", "kernel_sha256": SHA, "qemu_version": "8.2",
               "memory_sha256": SHA, "memory_bytes": 1 << 28, "parent_tag": f"s{i - 1}" if i else None,
               "parent_content_hash": SHA if i else None, "labels": {}, "format": 1}
        (d / "snapshot.json").write_text(json.dumps(rec))
        for f in ("memory.bin", "vmstate", "diff.pages", "diff.data"):
            (d / f).touch()
    return f"s{n - 1}"


def start(code: Path, home: Path) -> tuple[subprocess.Popen, str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, FORKD_HOME=str(home), FORKD_VMM_DRIVER="fake", PYTHONPATH=str(code),
               FORKD_SWEEP_INTERVAL="3600")
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--bind", f"127.0.0.1:{port}",
                             "--token-file", str(home / "token")], env=env, cwd=code,
                            stdout=open(home / "daemon.log", "ab"), stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon from {code} did not come up: {(home / 'daemon.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200 and (home / "token").exists():
                return proc, url, (home / "token").read_text().strip()
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def measure(sides: dict[str, tuple[str, str]], head: str, calls: int) -> dict[str, dict[str, list[float]]]:
    """Milliseconds per call for every (side, route), interleaved; a route a side does not serve is left out."""
    clients = {side: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok}"}, timeout=30)
               for side, (url, tok) in sides.items()}
    pairs = [(side, name) for side in sides for name, (path, _) in ROUTES.items()
             if clients[side].get(path.format(tag=head)).status_code == 200]
    out: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    for _ in range(calls):
        for side, name in pairs:
            t0 = time.perf_counter()
            r = clients[side].get(ROUTES[name][0].format(tag=head))
            out[side].setdefault(name, []).append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
    for c in clients.values():
        c.close()
    return out


def commit(code: Path) -> str:
    """The checkout's commit (`+` when its tree has changes)."""
    head = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+" if dirty else "")


def summary(ms: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    return {side: {name: {"calls": len(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90), "min": min(xs),
                          "max": max(xs)} for name, xs in routes.items()} for side, routes in ms.items()}


def table(result: dict) -> str:
    rows = ["| daemon | route | calls | p50 ms | p90 ms |", "|---|---|---|---|---|"]
    for side, routes in result["ms"].items():
        for name, x in routes.items():
            rows.append(f"| {side} | `{ROUTES[name][1]}` | {x['calls']} | {fmt(x['p50'])} | {fmt(x['p90'])} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="a checkout of the code before the change, run beside this one")
    ap.add_argument("--snapshots", type=int, default=20)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ap.add_argument("--report", action="store_true", help="write a dated report to bench/reports")
    a = ap.parse_args()
    codes = {"after": REPO, **({"before": a.before.resolve()} if a.before else {})}
    facts_before, procs, sides = host_facts(), [], {}
    with tempfile.TemporaryDirectory(prefix="fkbench-snap") as tmp:
        try:
            for side, code in codes.items():
                home = Path(tmp) / side
                head = make_home(home, a.snapshots)
                proc, url, tok = start(code, home)
                procs.append(proc)
                sides[side] = (url, tok)
            ms = measure(sides, head, a.calls)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    result = {"snapshots": a.snapshots, "calls": a.calls, "head": head, "ms": summary(ms),
              "code": {side: commit(code) for side, code in codes.items()},
              "host_before": facts_before, "host_after": host_facts()}
    print(json.dumps(result, indent=2) if a.output == "json" else table(result))
    if a.report:
        md = (f"# Snapshot routes: old URLs beside new\n\n{a.snapshots} snapshots (a chain), {a.calls} calls per "
              f"route, interleaved; `before` is the code before the change, `after` this tree (commits: "
              f"{', '.join(f'{k} {v}' for k, v in result['code'].items())}). Host: "
              f"{facts_before['cpus']} CPUs shared with other sessions, load {facts_before['load_1m']} before and "
              f"{result['host_after']['load_1m']} after, {facts_before['qemu_processes']} QEMU processes of others "
              f"running.\n\n{table(result)}\n")
        for p in write_report(REPO / "bench" / "reports", "snapshot-routes", result, md):
            print(p, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
