#!/usr/bin/env python3
"""Files throughput benchmark (issue 16, the files part of bench/agent.py), in one run with real VMs:

    python3 bench/agent_files.py [--home DIR] [--size-mib 1024] [--runs 3] [--short] [-o json]

A file of --size-mib MiB is uploaded to a child and downloaded back, side by side:
  api     through the daemon's API over TCP loopback with a bearer token (PUT/GET /v1/sandboxes/{id}/files/content,
          the body streamed in 1 MiB pieces, the answer read as it arrives), and
  direct  the same chunked fs_write/fs_read ops on the child's agent socket in this process (no HTTP, no daemon),
so the ratio api/direct is what the API layer costs. Prints MiB/s p50/p90 per path and direction over --runs.
--short (CI): 4 MiB, one run, a small guest.

What the figures leave out: the data is a repeated 1 MiB random block made in memory (no host disk reads or
writes), the guest keeps the file in RAM (its root is an initramfs, a tmpfs of half the guest's RAM, so the
guest has 2 x --size-mib + 512 MiB of memory), downloads are counted but not hashed, and the child is forked
and warmed up (1 MiB each way on both paths) before timing starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from forkd.base.errors import ForkdError  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core.requests import ParentBuild  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.vmm.agent_files import AgentFiles  # noqa: E402

MIB = 1 << 20


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def source(size: int):
    block = os.urandom(MIB)
    for i in range(0, size, MIB):
        yield block[:min(MIB, size - i)]


def start_daemon(home: str) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    token_file = Path(tempfile.mkdtemp(prefix="fkfiles")) / "token"
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--bind", f"127.0.0.1:{port}",
                             "--token-file", str(token_file), "--interval", "1"],
                            env=dict(os.environ, FORKD_HOME=home), stdout=open(token_file.parent / "daemon.log", "ab"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if token_file.exists() and httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url, token_file.read_text().strip()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the daemon did not come up")


def timed(fn) -> float:
    t0 = time.perf_counter()
    n = fn()
    return n / MIB / (time.perf_counter() - t0)


def direct_runs(rt: Runtime, cid: str, size: int) -> tuple[float, float]:
    def up() -> int:
        with rt.agent(cid) as a:
            return AgentFiles(a, timeout=600).write("/root/direct.bin", source(size))

    def down() -> int:
        with rt.agent(cid) as a:
            return sum(len(c) for c in AgentFiles(a, timeout=600).read("/root/direct.bin"))
    u = timed(up)
    d = timed(down)
    with rt.agent(cid) as a:
        AgentFiles(a).remove("/root/direct.bin")
    return u, d


def api_runs(h: httpx.Client, cid: str, size: int) -> tuple[float, float]:
    path = f"/v1/sandboxes/{cid}/files/content"

    def up() -> int:
        r = h.put(path, params={"path": "/root/api.bin"}, content=source(size),
                  headers={"Content-Type": "application/octet-stream"})
        r.raise_for_status()
        return r.json()["bytes"]

    def down() -> int:
        with h.stream("GET", path, params={"path": "/root/api.bin"}) as r:
            r.raise_for_status()
            return sum(len(c) for c in r.iter_bytes())
    u = timed(up)
    d = timed(down)
    h.delete(f"/v1/sandboxes/{cid}/files", params={"path": "/root/api.bin"})
    return u, d


def measure(rt: Runtime, h: httpx.Client, cid: str, size: int, runs: int) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {"direct upload": [], "direct download": [], "api upload": [], "api download": []}
    log("warming up both paths (1 MiB each way, not timed): a fresh child's first calls translate code")
    direct_runs(rt, cid, MIB)
    api_runs(h, cid, MIB)
    for i in range(runs):
        log(f"run {i + 1}/{runs}: {size // MIB} MiB each way, direct then api")
        u, d = direct_runs(rt, cid, size)
        res["direct upload"].append(u)
        res["direct download"].append(d)
        log(f"direct: upload {u:.1f} MiB/s, download {d:.1f} MiB/s")
        u, d = api_runs(h, cid, size)
        log(f"api: upload {u:.1f} MiB/s, download {d:.1f} MiB/s")
        res["api upload"].append(u)
        res["api download"].append(d)
    return res


def report(res: dict[str, list[float]], size: int, output: str) -> None:
    summary = {k: {"p50_mib_s": pct(v, 50), "p90_mib_s": pct(v, 90), "runs": v} for k, v in res.items()}
    for way in ("upload", "download"):
        summary[f"ratio api/direct {way} (p50)"] = summary[f"api {way}"]["p50_mib_s"] / \
            summary[f"direct {way}"]["p50_mib_s"]
    if output == "json":
        print(json.dumps({"size_bytes": size, **summary}, indent=2))
        return
    print(f"files throughput, {size / MIB:.0f} MiB each way (MiB/s; higher is better)")
    print(f"{'path':<18}{'p50':>10}{'p90':>10}")
    for k, v in res.items():
        print(f"{k:<18}{pct(v, 50):>10.1f}{pct(v, 90):>10.1f}")
    for way in ("upload", "download"):
        print(f"api/direct {way}: {summary[f'ratio api/direct {way} (p50)']:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=str(settings().home))
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--short", action="store_true", help="CI: 4 MiB, one run")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still kills the child and the daemon
    size_mib, runs = (4, 1) if args.short else (args.size_mib, args.runs)
    # the file lives in the guest's root, a tmpfs of half its RAM (one copy at a time)
    memory = 2 * size_mib + 512 if size_mib > 64 else 512
    tag = f"bench-files-{memory}"
    rt = Runtime(Layout(Path(args.home)))
    try:
        rt.store.get_ready(tag)
    except ForkdError:
        log(f"creating snapshot {tag} ({memory} MiB)")
        rt.create_snapshot(ParentBuild.of(tag=tag, memory_mib=memory))
    daemon, url, token = start_daemon(args.home)
    cid = None
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=3600) as h:
            # a lifetime past the run: the daemon's default (FORKD_SANDBOX_TIMEOUT, 300 s) ends a 1 GiB run midway
            r = h.post("/v1/sandboxes", json={"snapshot_tag": tag, "lifetime_secs": 86400})
            r.raise_for_status()
            cid = r.json()[0]["id"]
            report(measure(rt, h, cid, size_mib * MIB, runs), size_mib * MIB, args.output)
            h.delete(f"/v1/sandboxes/{cid}")
            cid = None
    finally:
        if cid:
            with contextlib.suppress(ForkdError):  # e.g. already gone: the daemon must still be stopped
                rt.kill([cid])
        daemon.terminate()
        daemon.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
