#!/usr/bin/env python3
"""Kubernetes path: claim latency through the operator vs the node daemon, convergence after a node is lost, and
exec from a pod through a claim's endpoint with its scoped token vs the node's full token.

    python3 bench/k8s.py [--image-from HOME] [--driver qemu|fake] [--claims 5] [--execs 20] [-o json]
                         [--out bench/reports]

The rig: the Kubernetes API server stand-in of the tests (kmock's KubernetesEmulator, tests/k8s/apiserver.py: not
a real API server), three real node daemons s1-s3 (`forkd serve` over TCP on loopback with one bearer token, found
from their pods as the DaemonSet's), the real operator process (`python -m forkd.operator run`), real VMs. Each
node offers room for two children of 128 MiB (FORKD_NODE_MEMORY_MIB=300), so a pool of 3 warm children of a 256 MiB
parent does not fit one node and is split 1+1+1 (a pool that fits one node goes to one node). `--driver fake` runs
the nodes' VMs as the fake driver's host processes (forkd/vmm/fake.py): the claim and node-loss figures are then
the operator's and daemons' own cost without QEMU's; the exec figures are not a VM's.

(a) Claim latency, side by side (operator, daemon, operator, daemon, ...): through the operator, from the
    ForkClaim's create to its status Ready with its children and Secret (polled every 20 ms: that is the
    resolution); through the daemon, one POST /v1/pools/NAME/claim. Both claim one warm child: before each sample
    the pool is back at its target (the claim deleted or the child killed, the pool refilled), not timed. With
    `--baseline TREE`, the same is then done through the operator of that checkout (run from it: `python -m`
    imports its forkd) in place of this one, against the same daemons; after each operator starts, one claim is
    made untimed (its resume of every resource is not a claim's cost).
(b) Node loss, once: with a claim holding a child on one node, that node's daemon is SIGKILLed and its pod marked
    not Ready (what the kubelet reports once the readiness probe fails; the probe's own delay is not in the
    figure). Timed from the kill: the claim's status Degraded with reason NodeLost, and the pool's status back at
    its target (Ready, every share warm) on the two other nodes alone.
(c) Exec from a pod, side by side: a process that has only a claim Secret's token and its children's endpoints
    (no FORKD_* variables) runs `true` through the Python SDK (`Sandbox.connect(id, url=endpoint, token=...)`),
    `--execs` times; the same process with the node's full bearer token instead; the rounds alternate.

Prints p50/p90 of each side and the ratios; writes `<out>/<UTC date>-k8s.md` and `.json` (bench/lib/reports.py).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.reports import fmt, host_facts, percentile, ratio, write_report  # noqa: E402

NS, SYSTEM = "bench", "forkd-system"
SELECTOR = f"{SYSTEM}/app.kubernetes.io/component=node-daemon"
POLL = 0.02

POD = r"""
import json, os, sys, time
from forkd_client import Sandbox
token, children, n = os.environ["POD_TOKEN"], json.loads(os.environ["POD_CHILDREN"]), int(sys.argv[1])
boxes = [Sandbox.connect(c["id"], url=c["endpoint"], token=token) for c in children]
boxes[0].commands.run("true")  # the connection made once, as a pod's agent keeps its client
took = []
for i in range(n):
    sb = boxes[i % len(boxes)]
    t0 = time.perf_counter()
    res = sb.commands.run("true")
    took.append((time.perf_counter() - t0) * 1000.0)
    assert res.exit_code == 0, res
print(json.dumps(took))
"""


def log(msg: str) -> None:
    print(f"[k8s {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def until(what: str, probe, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/k8s.py: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL)


def doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "forkd.dev/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def ready(obj: dict | None) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions") or [])


def reason(obj: dict | None, type_: str) -> str | None:
    return next((c.get("reason") for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == type_ and c.get("status") == "True"), None)


class Rig:
    """API server stand-in, three node daemons found from their pods, the operator, a parent and a pool."""

    def __init__(self, image_home: Path, workdir: Path, warm: int = 3, baseline: Path | None = None) -> None:
        from tests.k8s.apiserver import ApiServer
        from tests.k8s.conftest import Operator

        self.image_home, self.warm, self.workdir, self.token = image_home, warm, workdir, secrets.token_urlsafe(32)
        self.api = ApiServer().start()
        self.nodes = {name: self.node(name) for name in ("s1", "s2", "s3")}
        env = {"FORKD_NODE_PODS": SELECTOR, "FORKD_TOKEN": self.token}
        self.ops = {"this": Operator(self.api, None, workdir, cwd=Path(__file__).resolve().parent.parent, **env)}
        if baseline is not None:  # another checkout's operator, run in turns with this one (one at a time)
            (workdir / "baseline").mkdir()
            self.ops["baseline"] = Operator(self.api, None, workdir / "baseline", cwd=baseline, **env)
        self.side = "this"
        self.op = self.ops["this"].start()

    def use(self, side: str) -> None:
        """Run `side`'s operator (stopping the other): it resumes every resource, as after a restart."""
        if side != self.side:
            self.op.stop()
            self.side, self.op = side, self.ops[side].start()

    def node(self, name: str):
        from forkd.base.paths import Layout
        from tests.k8s.conftest import Node

        layout = Layout(self.image_home)
        n = Node(name, images=layout.images, token=self.token, memory_mib=300, logdir=self.workdir)
        if layout.accel_cache.exists():
            shutil.copy(layout.accel_cache, n.layout.accel_cache)
        self.api.create("pods", n.pod(SYSTEM))
        return n

    def backend(self, name: str):
        from forkd.client.remote import RemoteBackend

        return RemoteBackend(url=self.nodes[name].url, token=self.token)

    def pool(self) -> dict | None:
        return self.api.get("forkpools", NS, "bp")

    def idle(self, name: str) -> int:
        return sum(1 for c in self.backend(name).children() if c.get("status") == "running" and not c.get("claimed"))

    def pool_full(self, nodes: tuple[str, ...] | None = None) -> bool:
        """The pool Ready at its target, every share warm, on `nodes` (default: all)."""
        st = (self.pool() or {}).get("status") or {}
        shares = {s["node"]: s for s in st.get("nodes") or [] if s.get("target")}
        return ready(self.pool()) and st.get("warm") == self.warm and all(
            s["warm"] >= s["target"] for s in shares.values()) and (nodes is None or set(shares) <= set(nodes))

    def up(self) -> None:
        self.api.create("forkparents", doc("ForkParent", "bbase", {"memoryMiB": 256}))
        self.api.create("forkpools", doc("ForkPool", "bp", {"from": "bbase", "warm": self.warm,
                                                             "maxChildren": self.warm + 2}))
        until("the pool Ready at its target", self.pool_full, 3600)

    def stop(self) -> None:
        for op in self.ops.values():
            op.stop()
        for n in self.nodes.values():
            n.stop()
        self.api.stop()


def claim_via_operator(rig: Rig, i: int) -> float:
    name = f"bc-{i}"
    t0 = time.perf_counter()
    rig.api.create("forkclaims", doc("ForkClaim", name, {"pool": "bp", "count": 1, "ttl": "10m"}))
    until(f"claim {name} Ready", lambda: (o := rig.api.get("forkclaims", NS, name)) and ready(o)
          and len(o["status"].get("children") or []) == 1 and o["status"].get("tokenSecret"), 600)
    took = (time.perf_counter() - t0) * 1000.0
    rig.api.delete("forkclaims", NS, name)
    until(f"claim {name} gone", lambda: rig.api.get("forkclaims", NS, name) is None, 600)
    return took


def claim_via_daemon(rig: Rig) -> float:
    node = max(sorted(rig.nodes), key=rig.idle)
    b = rig.backend(node)
    t0 = time.perf_counter()
    kids = b.claim(f"{NS}.bp", 1)
    took = (time.perf_counter() - t0) * 1000.0
    b.kill([k["id"] for k in kids])
    return took


def bench_claims(rig: Rig, n: int) -> dict:
    """Per operator (this tree's, then the baseline's), one untimed claim after it starts (its resume of every
    resource is not a claim's cost), then `n` claims through it alternating with `n` through the daemon."""
    out: dict[str, list[float]] = {"operator_ms": [], "daemon_ms": [], "baseline_ms": []}
    for side in rig.ops:
        rig.use(side)
        until("the pool refilled", rig.pool_full, 900)
        claim_via_operator(rig, len(out["operator_ms"]) + len(out["baseline_ms"]) + 100)  # warm-up, not counted
        for i in range(n):
            until("the pool refilled", rig.pool_full, 900)
            took = claim_via_operator(rig, len(out["operator_ms"]) + len(out["baseline_ms"]))
            out["operator_ms" if side == "this" else "baseline_ms"].append(took)
            until("the pool refilled", rig.pool_full, 900)
            out["daemon_ms"].append(claim_via_daemon(rig))
            log(f"claim {i}: {side} operator {took:.0f} ms, daemon {out['daemon_ms'][-1]:.0f} ms")
    rig.use("this")
    return out


def pod_execs(children: list[dict], token: str, n: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    env.update(POD_TOKEN=token, POD_CHILDREN=json.dumps(children))
    res = subprocess.run([sys.executable, "-c", POD, str(n)], env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"bench/k8s.py: the pod process failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout)


def bench_exec(rig: Rig, n: int, rounds: int = 2) -> dict:
    until("the pool refilled", rig.pool_full, 900)
    rig.api.create("forkclaims", doc("ForkClaim", "bx", {"pool": "bp", "count": 1, "ttl": "30m"}))
    claim = until("claim bx Ready", lambda: (o := rig.api.get("forkclaims", NS, "bx")) and ready(o)
                  and o["status"].get("tokenSecret") and o, 600)
    secret = rig.api.get("secrets", NS, claim["status"]["tokenSecret"])
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    children = json.loads(data["children"])
    scoped, full = [], []
    for _ in range(rounds):
        scoped += pod_execs(children, data["token"], n // rounds)
        full += pod_execs(children, rig.token, n // rounds)
    rig.api.delete("forkclaims", NS, "bx")
    until("claim bx gone", lambda: rig.api.get("forkclaims", NS, "bx") is None, 600)
    return {"scoped_ms": scoped, "full_ms": full}


def lose_node(rig: Rig) -> dict:
    """Kill the daemon of the node a claim's child is on; time NodeLost and the pool back on the other two."""
    until("the pool refilled", rig.pool_full, 900)
    name = "bl"
    rig.api.create("forkclaims", doc("ForkClaim", name, {"pool": "bp", "count": 1, "ttl": "30m"}))
    claim = until(f"claim {name} Ready", lambda: (o := rig.api.get("forkclaims", NS, name)) and ready(o) and o, 600)
    gone = claim["status"]["children"][0]["node"]
    until("the pool refilled", rig.pool_full, 900)
    node = rig.nodes[gone]
    pod = node.pod(SYSTEM)["metadata"]["name"]
    t0 = time.perf_counter()
    node.proc.send_signal(signal.SIGKILL)
    rig.api.patch("pods", SYSTEM, pod, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    until("the claim NodeLost", lambda: reason(rig.api.get("forkclaims", NS, name), "Degraded") == "NodeLost", 600)
    lost = (time.perf_counter() - t0) * 1000.0
    rest = tuple(n for n in sorted(rig.nodes) if n != gone)
    until(f"the pool back at its target on {' and '.join(rest)}", lambda: rig.pool_full(rest), 1800)
    refilled = (time.perf_counter() - t0) * 1000.0
    log(f"node {gone} lost: NodeLost after {lost:.0f} ms, pool back at target on the others after {refilled:.0f} ms")
    rig.api.delete("forkclaims", NS, name)
    until(f"claim {name} gone", lambda: rig.api.get("forkclaims", NS, name) is None, 600)
    return {"node": gone, "node_lost_ms": lost, "refilled_ms": refilled}


def summary(xs: list[float]) -> dict:
    return {"p50_ms": percentile(xs, 50), "p90_ms": percentile(xs, 90), "n": len(xs)}


def markdown(result: dict, argv: str) -> str:
    c, x, lost = result["claims"], result["exec"], result["node_loss"]
    rows = [("claim via operator (ForkClaim -> Ready)", c["operator"]),
            *([(f"claim via the baseline's operator ({c['baseline_rev']})", c["baseline"])] if c.get("baseline")
              else []),
            ("claim via daemon (POST claim)", c["daemon"]),
            ("exec from the pod, scoped token", x["scoped"]), ("exec from the pod, full token", x["full"])]
    lines = [f"# Kubernetes path: claims, node loss, exec from a pod, {result['host']['at'][:10]}", "",
             f"`{argv}` (see bench/k8s.py for the rig: kmock's API server emulator, three real node daemons, "
             + ("the real operator process, real VMs under TCG)." if result["driver"] == "qemu" else
                "the real operator process; VMs of the fake driver: host processes, no QEMU)."), "",
             f"**Host.** {result['host']['cpus']} CPUs shared with other sessions; 1-minute load "
             f"{result['host']['load_1m']} before, {result['host_after']['load_1m']} after; "
             f"{result['host']['qemu_processes']} QEMU processes running at the start.", "",
             "| what | n | p50 ms | p90 ms |", "|---|---|---|---|"]
    lines += [f"| {name} | {s['n']} | {fmt(s['p50_ms'], '.0f')} | {fmt(s['p90_ms'], '.0f')} |" for name, s in rows]
    lines += ["", f"Ratio operator / daemon (p50): **{fmt(c['ratio_p50'], '.1f')}x**. "
              f"Ratio scoped / full token exec (p50): **{fmt(x['ratio_p50'], '.2f')}x**."
              + (f" Ratio baseline operator / this operator (p50): **{fmt(c['baseline_ratio_p50'], '.1f')}x**."
                 if c.get("baseline") else ""), "",
              "| node lost | claim NodeLost after (ms) | pool back at target on the other nodes after (ms) |",
              "|---|---|---|"]
    lines += [f"| {r['node']} | {fmt(r.get('node_lost_ms'), '.0f')} | {fmt(r.get('refilled_ms'), '.0f')} |"
              + (f" {r['error']}" if r.get("error") else "") for r in lost]
    lines += ["", "Raw samples: the `.json` beside this file.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image-from", type=Path, default=Path(os.environ.get("FORKD_HOME", "~/.forkd")).expanduser(),
                    help="a forkd home whose guest image the nodes copy (default: $FORKD_HOME)")
    ap.add_argument("--driver", choices=("qemu", "fake"), default="qemu",
                    help="the nodes' VMM driver (default qemu; fake: host processes, see above)")
    ap.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                    help="also claim through the operator of this checkout (e.g. a worktree of main), in turns "
                         "with this tree's, one operator running at a time")
    ap.add_argument("--claims", type=int, default=5, help="claims through each path (default 5)")
    ap.add_argument("--execs", type=int, default=20, help="execs with each token (default 20)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "reports")
    ap.add_argument("--no-report", action="store_true", help="print only")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args()
    if args.driver == "qemu" and not (args.image_from / "images" / "default").exists():
        raise SystemExit(f"bench/k8s.py: no guest image in {args.image_from}/images (build one: FORKD_HOME="
                         f"{args.image_from} forkd build image, or pass --image-from HOME)")
    os.environ["FORKD_VMM_DRIVER"] = args.driver  # the node daemons inherit it
    host = host_facts()
    workdir = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    rig = Rig(args.image_from, workdir, baseline=args.baseline)
    try:
        log("building the parent on each node, filling the pool")
        rig.up()
        claims = bench_claims(rig, args.claims)
        execs = bench_exec(rig, args.execs)
        log(f"exec p50: scoped {percentile(execs['scoped_ms'], 50):.0f} ms, "
            f"full {percentile(execs['full_ms'], 50):.0f} ms")
        try:
            losses = [lose_node(rig)]
        except SystemExit as exc:  # a timeout: reported, the other figures kept
            log(str(exc))
            losses = [{"node": "-", "error": str(exc)}]
    except BaseException:
        log(f"logs kept in {workdir}")
        raise
    finally:
        rig.stop()
    result = {"host": host, "host_after": host_facts(), "warm": rig.warm, "driver": args.driver,
              "claims": {"operator": summary(claims["operator_ms"]), "daemon": summary(claims["daemon_ms"]),
                         "raw": claims},
              "exec": {"scoped": summary(execs["scoped_ms"]), "full": summary(execs["full_ms"]), "raw": execs},
              "node_loss": losses}
    if claims["baseline_ms"]:
        rev = subprocess.run(["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or str(args.baseline)
        result["claims"].update(baseline=summary(claims["baseline_ms"]), baseline_rev=rev,
                                baseline_ratio_p50=ratio(percentile(claims["baseline_ms"], 50),
                                                         percentile(claims["operator_ms"], 50)))
    result["claims"]["ratio_p50"] = ratio(result["claims"]["operator"]["p50_ms"], result["claims"]["daemon"]["p50_ms"])
    result["exec"]["ratio_p50"] = ratio(result["exec"]["scoped"]["p50_ms"], result["exec"]["full"]["p50_ms"])
    text = markdown(result, "python3 bench/k8s.py " + " ".join(sys.argv[1:]))
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(text)
    if not args.no_report:
        for p in write_report(args.out, "k8s" if args.driver == "qemu" else f"k8s-{args.driver}", result, text):
            log(f"wrote {p}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
