#!/usr/bin/env python3
"""Build once, distribute by content: time to a warm pool on a second node by pulling vs by rebuilding there.

    python3 bench/distribute.py [--warm 2] [--memory-mib 256] [--report-dir bench/reports] [-o json]

Three nodes are three fresh forkd homes on this machine, each with its own reconciler (forkd.reconciler.control,
in this process), plus a real OCI registry on loopback (Debian's docker-registry, a temporary config and storage
directory). One run, side by side:

1. node A builds the ForkParent and a pool of `--warm` children from empty (image, boot, warm-up, save, forks);
2. node A pushes the parent's snapshot to the registry (`forkd snapshot push`: pack + upload), owned;
3. node B (empty) pulls it by digest, verifying every digest, then gets the same ForkParent + ForkPool applied: its
   reconciler finds the snapshot ready and only forks; timed from the pull's start to the pool Ready;
4. node C (empty) gets the same objects applied and rebuilds everything, as every node did before; timed from the
   apply to the pool Ready.

B's and C's children are checked to answer; B's snapshot is checked to be A's (same memory hash, source label of the
artifact). Steps 3 and 4 run once each, B before C (the page cache then favours C, if anything). Nothing is timed
in a loop: a run builds two parents under TCG.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.reports import host_facts, write_report  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.core.pack import oci as pack_oci  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from forkd.image.registry import RegistryOptions  # noqa: E402
from forkd.reconciler.control import Control  # noqa: E402
from forkd.spec.loader import load_text  # noqa: E402

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {{name: bench-dist}}
spec: {{memoryMiB: {memory}, warmup: {{imports: [json, decimal]}}}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {{name: bench-dist-pool}}
spec: {{from: bench-dist, warm: {warm}}}
"""
PLAIN = RegistryOptions(tls_verify=False)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start_registry(root: Path) -> tuple[subprocess.Popen, str]:
    """docker-registry on a free loopback port, plain HTTP, storage under `root`; (process, HOST:PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        host = f"127.0.0.1:{s.getsockname()[1]}"
    cfg = {"version": 0.1, "log": {"level": "error"}, "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
           "http": {"addr": host, "secret": "bench-only"}}
    (root / "config.yml").write_text(json.dumps(cfg))
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=2)
            return proc, host
        except urllib.error.HTTPError:
            return proc, host
        except OSError:
            time.sleep(0.05)  # polling until the port answers, with a deadline
    proc.kill()
    raise SystemExit(f"docker-registry on {host} did not answer")


def apply(control: Control, warm: int, memory: int) -> None:
    loaded, errors = load_text(SPEC.format(warm=warm, memory=memory), "bench-dist.yaml")
    assert not errors, errors
    control.apply([(x.obj, "bench") for x in loaded], "bench-dist")


def converge(control: Control, timeout: float = 1800) -> None:
    ok, problems = control.reconciler.run_until_converged(timeout, [("ForkPool", "bench-dist-pool")])
    if not ok:
        raise SystemExit(f"the pool did not become warm: {problems}")


def pool_children(rt: Runtime) -> list:
    return [r for r in rt.children() if r.pool and r.pool.endswith("bench-dist-pool") and r.status == "running"]


def parent_tag(control: Control) -> str:
    st = control.get("ForkParent", "bench-dist")[0].status
    assert st is not None and st.snapshot, "the parent has no snapshot"
    return st.snapshot


def node(root: Path, name: str) -> tuple[Runtime, Control]:
    rt = Runtime(Layout(root / name))
    return rt, Control(rt)


def run(warm: int, memory: int, root: Path) -> dict:
    reg_dir = root / "registry"
    reg_dir.mkdir()
    proc, host = start_registry(reg_dir)
    nodes: list[tuple[Runtime, Control]] = []
    res: dict = {"warm": warm, "memory_mib": memory}
    try:
        rt_a, ctl_a = node(root, "a")
        nodes.append((rt_a, ctl_a))
        log("node A: building the parent and its pool from empty")
        t0 = time.perf_counter()
        apply(ctl_a, warm, memory)
        converge(ctl_a)
        res["a_build_to_warm_s"] = time.perf_counter() - t0
        tag = parent_tag(ctl_a)
        log(f"node A: pushing {tag}")
        pushed = pack_oci.push(rt_a, tag, f"{host}/forkd/{tag}:{tag}", PLAIN, owned=True)
        res.update(push_s=pushed["seconds"], pack_bytes=pushed["pack_bytes"], logical_bytes=pushed["logical_bytes"],
                   digest=pushed["digest"])

        rt_b, ctl_b = node(root, "b")
        nodes.append((rt_b, ctl_b))
        log("node B: pull by digest, then apply")
        t0 = time.perf_counter()
        pulled = pack_oci.pull(rt_b, pushed["pinned"], PLAIN, owned=True)
        res["b_pull_s"] = time.perf_counter() - t0
        apply(ctl_b, warm, memory)
        converge(ctl_b)
        res["b_pull_to_warm_s"] = time.perf_counter() - t0
        assert parent_tag(ctl_b) == tag and pulled["installed"][-1] == tag
        same = rt_b.store.get(tag)
        assert same.memory_sha256 == rt_a.store.get(tag).memory_sha256, "node B forks another snapshot"
        assert same.labels["forkd.dev/source"] == "oci:" + pushed["pinned"].removeprefix("docker://")

        rt_c, ctl_c = node(root, "c")
        nodes.append((rt_c, ctl_c))
        log("node C: apply and rebuild there")
        t0 = time.perf_counter()
        apply(ctl_c, warm, memory)
        converge(ctl_c)
        res["c_rebuild_to_warm_s"] = time.perf_counter() - t0
        res["c_same_snapshot_bytes"] = rt_c.store.get(parent_tag(ctl_c)).memory_sha256 == same.memory_sha256
        for rt in (rt_b, rt_c):
            kids = pool_children(rt)
            assert len(kids) >= warm and all(rt.ping(k.id)["child_id"] == k.id for k in kids)
    finally:
        for rt, ctl in nodes:
            ctl.reconciler.close()
            rt.kill([r.id for r in rt.children()])
        proc.terminate()
        proc.wait()
    res["speedup"] = res["c_rebuild_to_warm_s"] / res["b_pull_to_warm_s"]
    return res


def markdown(res: dict, facts: dict) -> str:
    return "\n".join([
        "# Build once, distribute by content: a warm pool on a second node",
        "",
        f"Run at {facts['at']} on {facts['cpus']} CPUs (load {facts['load_1m']} at the start, "
        f"{facts.get('load_after')} at the end; {facts['qemu_processes']} other QEMU processes). TCG. "
        f"Pool of {res['warm']} children of {res['memory_mib']} MiB. `python3 bench/distribute.py`.",
        "",
        "| step | seconds |",
        "|---|---:|",
        f"| node A: build parent + pool from empty | {res['a_build_to_warm_s']:.1f} |",
        f"| node A: push (pack + upload, {res['pack_bytes'] / 2**20:.1f} MiB for {res['logical_bytes'] / 2**20:.0f} "
        f"MiB of files) | {res['push_s']:.1f} |",
        f"| node B: pull by digest (download + verify + unpack) | {res['b_pull_s']:.1f} |",
        f"| **node B: pull -> pool warm** | **{res['b_pull_to_warm_s']:.1f}** |",
        f"| **node C: rebuild -> pool warm** | **{res['c_rebuild_to_warm_s']:.1f}** |",
        "",
        f"Pulling reached a warm pool {res['speedup']:.1f}x sooner than rebuilding. Node B forks node A's snapshot "
        "(same memory hash, checked); node C's rebuilt snapshot has "
        + ("the same" if res["c_same_snapshot_bytes"] else "a different")
        + " memory hash (a rebuild is another snapshot).",
        ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", type=int, default=2, help="children in the pool on each node")
    ap.add_argument("--memory-mib", type=int, default=256)
    ap.add_argument("--report-dir", type=Path, default=None, help="write a dated report here (bench/reports)")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    if shutil.which("docker-registry") is None or shutil.which("skopeo") is None:
        raise SystemExit("docker-registry and skopeo are needed (scripts/setup.sh --dev installs them)")
    facts = host_facts()
    root = Path(tempfile.mkdtemp(prefix="fkdist", dir="/tmp"))
    try:
        res = run(args.warm, args.memory_mib, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    facts["load_after"] = round(os.getloadavg()[0], 2)
    res["host"] = facts
    md = markdown(res, facts)
    if args.report_dir:
        paths = write_report(args.report_dir, "distribute", res, md)
        log(f"wrote {paths[0]} and {paths[1]}")
    print(json.dumps(res, indent=2) if args.output == "json" else md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
