#!/usr/bin/env python3
"""Agent benchmark (issue 16), in one run against a real daemon (its unix socket) and real VMs:

    python3 bench/agent.py [--home DIR] [--runs 20] [--quick] [-o json]

1. CLI start-up: `forkd exec ID -- true` end to end through the daemon (the light client, forkd/cli/daemon.py),
   side by side with `python -c pass` and with the full CLI's import (`import forkd.cli.main`, what every
   `forkd exec` paid before); p50/p90 and the ratio;
2. time to the first streamed byte of `python3 -c 'print(1)'` in a warm child (POST .../processes until the
   first stdout event), side by side with the blocking exec route's whole round trip;
3. 100 concurrent streaming commands over 10 children (all started at once): p50/p99 of each command's
   whole stream and the wall time.
Left out: network (loopback unix socket only), KVM (this host runs TCG), and a busy host's noise (the p90/p99
say how much). Each measure is one function; more (downloads, uploads) append their own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd_client.processes import RemoteProcesses  # noqa: E402

from forkd.base.errors import ForkdError  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core.requests import ParentBuild  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.sdk import Controller  # noqa: E402

TAG = "bench-agent"
ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))]


def stats(xs: list[float], hi: int = 90) -> dict:
    return {"p50": statistics.median(xs), f"p{hi}": pct(xs, hi), "n": len(xs)}


def timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True)
    if res.returncode != 0:
        raise SystemExit(f"{argv} exited {res.returncode}: {res.stderr.decode()[-2000:]}")
    return (time.perf_counter() - t0) * 1000


def cli_startup(home: str, child: str, runs: int) -> dict:
    """`forkd exec ID -- true` through the daemon vs `python -c pass` vs importing the full CLI."""
    env = dict(os.environ, FORKD_HOME=home, PYTHONPATH=str(ROOT))
    py = sys.executable
    cases = {"python_pass": [py, "-c", "pass"],
             "full_cli_import": [py, "-c", "import forkd.cli.main"],
             "forkd_exec": [py, "-m", "forkd.cli.main", "exec", child, "--", "true"]}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):  # interleaved, so load changes hit every case alike
        for k, argv in cases.items():
            times[k].append(timed(argv, env))
    res = {k: stats(v) for k, v in times.items()}
    res["full_import_over_exec"] = res["full_cli_import"]["p50"] / res["forkd_exec"]["p50"]
    return res


def first_byte(c: Controller, child: str, runs: int) -> dict:
    """Time to the first stdout byte of python3 -c 'print(1)' streamed, and the blocking exec round trip."""
    procs = RemoteProcesses(c)
    ttfb, whole = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        for ev in procs.stream(child, ["python3", "-c", "print(1)"]):
            if ev["type"] == "stdout":
                ttfb.append((time.perf_counter() - t0) * 1000)
                assert ev["data"] == b"1\n", ev
            if ev["type"] == "exit":
                break
        t0 = time.perf_counter()
        assert c.exec_command(child, ["python3", "-c", "print(1)"])["stdout"] == "1\n"
        whole.append((time.perf_counter() - t0) * 1000)
    return {"first_byte_ms": stats(ttfb), "exec_blocking_ms": stats(whole),
            "ratio": statistics.median(whole) / statistics.median(ttfb)}


def concurrent_streams(c: Controller, ids: list[str], n: int) -> dict:
    """`n` streaming commands over the children, all at once: each one's whole stream, and the wall time."""
    procs = RemoteProcesses(c)

    errors: list[str] = []

    def one(i: int) -> float | None:
        t0 = time.perf_counter()
        out = b""
        try:
            for ev in procs.stream(ids[i % len(ids)], cmd=f"echo {i}; sleep 0.1; echo done"):
                out += ev.get("data", b"") if ev["type"] == "stdout" else b""
                if ev["type"] == "error":
                    errors.append(f"{ev.get('title')}: {ev.get('detail')}")
        except ForkdError as exc:
            errors.append(f"{type(exc).__name__}: {exc.message}")
            return None
        if out != f"{i}\ndone\n".encode():
            errors.append(f"command {i}: stdout {out!r}")
            return None
        return (time.perf_counter() - t0) * 1000

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        lat = [x for x in pool.map(one, range(n)) if x is not None]
    return {"latency_ms": stats(lat or [0.0], 99), "wall_s": time.perf_counter() - t0, "n": n,
            "children": len(ids), "failed": len(errors), "errors": errors[:5]}


def start_daemon(home: str) -> tuple[subprocess.Popen, Path]:
    log_path = Path(tempfile.mkdtemp(prefix="fkagent")) / "daemon.log"
    d = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "0.5"],
                         env=dict(os.environ, FORKD_HOME=home), stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)
    sock = Layout(Path(home)).daemon_socket
    deadline = time.monotonic() + 60
    while True:
        try:
            Controller(socket=sock).healthz()
            return d, log_path
        except ForkdError:
            if d.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("daemon did not start:\n" + log_path.read_text()[-2000:]) from None
            time.sleep(0.1)


def report(res: dict) -> None:
    print("forkd agent benchmark (daemon on its unix socket, TCG, 2 cores)")
    if "cli_startup" in res:
        startup(res["cli_startup"])
    if "first_byte" in res:
        f = res["first_byte"]
        print(f"  first streamed byte of python3 -c 'print(1)': p50 {f['first_byte_ms']['p50']:.1f} ms  "
              f"p90 {f['first_byte_ms']['p90']:.1f} ms; blocking exec p50 {f['exec_blocking_ms']['p50']:.1f} ms "
              f"({f['ratio']:.2f}x)")
    if "concurrent_streams" in res:
        concurrent(res["concurrent_streams"])


def startup(s: dict) -> None:
    for k in ("forkd_exec", "full_cli_import", "python_pass"):
        print(f"  {k:<26} p50 {s[k]['p50']:7.1f} ms  p90 {s[k]['p90']:7.1f} ms")
    print(f"  >>> full CLI import / whole light `forkd exec` = {s['full_import_over_exec']:.2f}x")


def concurrent(cc: dict) -> None:
    print(f"  {cc['n']} concurrent streaming commands over {cc['children']} children: p50 "
          f"{cc['latency_ms']['p50']:.1f} ms  p99 {cc['latency_ms']['p99']:.1f} ms  wall {cc['wall_s']:.1f} s  "
          f"failed {cc['failed']}")
    for e in cc["errors"]:
        print(f"    failed: {e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=str(settings().home))
    ap.add_argument("--runs", type=int, default=20, help="runs of each sequential measure")
    ap.add_argument("--quick", action="store_true", help="3 runs, 20 concurrent commands over 2 children")
    ap.add_argument("--only", choices=["cli_startup", "first_byte", "concurrent_streams"], help="run one measure")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    runs, n, kids = (3, 20, 2) if args.quick else (args.runs, 100, 10)
    rt = Runtime(Layout(Path(args.home)))
    try:
        rt.store.get_ready(TAG)
    except ForkdError:
        log(f"creating snapshot {TAG} (256 MiB)")
        rt.create_snapshot(ParentBuild.of(tag=TAG, memory_mib=256))
    daemon, _ = start_daemon(args.home)
    ids: list[str] = []
    res: dict = {}
    try:
        c = Controller(socket=Layout(Path(args.home)).daemon_socket, timeout=600)
        log(f"spawning {kids} children")
        ids = [s["id"] for s in c.spawn_sandboxes(TAG, n=kids)]
        if args.only in (None, "cli_startup"):
            log("CLI start-up")
            res["cli_startup"] = cli_startup(args.home, ids[0], runs)
        if args.only in (None, "first_byte"):
            log("first streamed byte")
            res["first_byte"] = first_byte(c, ids[0], runs)
        if args.only in (None, "concurrent_streams"):
            log(f"{n} concurrent streams")
            res["concurrent_streams"] = concurrent_streams(c, ids, n)
    finally:
        for i in ids:
            try:
                Controller(socket=Layout(Path(args.home)).daemon_socket).kill_sandbox(i)
            except ForkdError:
                pass
        daemon.terminate()
        daemon.wait(timeout=30)
    print(json.dumps(res, indent=2)) if args.output == "json" else report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
