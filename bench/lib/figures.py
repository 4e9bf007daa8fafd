"""The figures a benchmark report quotes: where each sits in a benchmark's JSON, its unit, and what it measures.

One table serves the dated report page (bench/all.py) and the commit comparison (bench/compare.py), so a figure
is named and explained once. A figure's value in a result is a number, or a summary holding `p50` (and `p90`,
`samples` when the benchmark kept them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lib.reports import percentile


@dataclass(frozen=True)
class Figure:
    """One quoted figure: `path` is its dotted place in the benchmark's JSON."""

    bench: str
    path: str
    label: str
    unit: str
    measures: str


FIGURES: tuple[Figure, ...] = (
    Figure("plan", "plan_ms", "plan()", "ms", "plan(desired, actual) over 1,000 objects, no VM (pure CPU)"),
    Figure("plan", "status_ms", "compute_status()", "ms", "compute_status() over the same 1,000 objects"),
    Figure("fork", "cold", "cold boot + warm-up", "ms",
           "a fresh parent VM from QEMU start until its first eval answers, warm-up imports included"),
    Figure("fork", "fork", "fork -> first eval", "ms",
           "restore of a warm snapshot until an eval answers over a fresh connection (one child at a time)"),
    Figure("fork", "fanout.eval_done_after_request_ms", "fan-out, each child's eval", "ms",
           "from one fan-out request until each of its children answered an eval"),
    Figure("fork", "fanout.children_per_s_eval", "fan-out rate", "children/s",
           "children answering an eval per second of the fan-out"),
    Figure("fork", "memory.guest_private_mib", "guest private pages per child", "MiB",
           "guest RAM a child wrote since its fork (its own pages; QEMU's own memory not included)"),
    Figure("fork", "memory.vmm_pss_mib", "VMM Pss per child", "MiB",
           "host memory of a child's QEMU process, Pss (shared pages split among sharers; VMM included)"),
    Figure("fork", "cpu_per_child_ms.total", "CPU per child", "ms",
           "host CPU (forkd + QEMU) one sequential fork and its first eval cost"),
    Figure("density", "final.mem_per_child_mib", "host memory per idle child (MemAvailable)", "MiB",
           "the host's MemAvailable drop divided by the idle children (VMM, page cache and all; host-wide, so on a "
           "shared host other processes move it too, even below zero)"),
    Figure("density", "final.pss_per_child_mib", "host memory per idle child (Pss)", "MiB",
           "the summed Pss of the children's QEMU processes divided by their number (VMM included)"),
    Figure("density", "final.guest_private_mib_p50", "guest private pages per idle child", "MiB",
           "guest RAM each idle child wrote (not host memory: QEMU's own comes on top)"),
    Figure("density", "final.exec_ms", "first exec of an idle child", "ms",
           "an exec on a child that sat idle, until it answered"),
    Figure("density", "final.idle_cpu_pct_per_child", "idle CPU per child", "% of a core",
           "host CPU an idle child's QEMU used over the sampling window"),
    Figure("branch", "sizes.0.modes.live.host_pause_ms", "live branch pause", "ms",
           "how long the running source child was stopped by a live branch (host side: stop .. resumed)"),
    Figure("branch", "sizes.0.modes.live.ready_ms", "live branch until ready", "ms",
           "from the branch request until its snapshot is ready (wait=True)"),
    Figure("branch", "sizes.0.modes.diff.host_pause_ms", "diff branch pause", "ms",
           "how long the source child was stopped by a diff branch (host side)"),
    Figure("branch", "sizes.0.nowait_return_ms.pages", "live --no-wait return", "ms",
           "until a live branch (by pages) with wait=False returned"),
    Figure("chain", "spawn_ms.bench-l0", "spawn from a base", "ms", "fork of a base snapshot until it answers"),
    Figure("chain", "spawn_ms.bench-l3", "spawn from a layer 3 deep", "ms",
           "fork of a snapshot three layers above its base until it answers"),
    Figure("pool", "claim_core_ms", "claim (in-process)", "ms", "one claim from a warm pool, Control.claim"),
    Figure("pool", "claim_api_ms", "claim (daemon socket)", "ms", "the same claim through a daemon's HTTP socket"),
    Figure("pool", "hand_out_32_ms.now", "hand out 32", "ms", "32 children handed out from a warm pool at once"),
    Figure("pool", "back_at_target_after_10_s", "pool refill after 10 claims", "s",
           "until the reconcile loop has the pool back at its target"),
    Figure("api", "exec_rest_ms", "exec through REST", "ms", "`true` through POST /v1/sandboxes/{id}/exec"),
    Figure("api", "exec_direct_ms", "exec direct to the agent", "ms", "the same exec on the agent's socket"),
    Figure("api", "concurrent_100", "100 concurrent evals", "ms", "latency of 100 evals over 10 children, 20 threads"),
    Figure("api", "claim_10_ms", "claim 10 through the API", "ms", "POST /v1/pools/{name}/claim of 10 warm children"),
    Figure("isolation", "spawn_to_answer_ms.isolated", "spawn, own network namespace", "ms",
           "fork until it answers, the child in a network namespace of its own"),
    Figure("isolation", "spawn_to_answer_ms.none", "spawn, no isolation", "ms",
           "fork until it answers, no network namespace"),
)

PLAN_LINE = re.compile(r"^(plan|compute_status)\(\):\s+p50\s+([\d.]+) ms\s+p90\s+([\d.]+) ms", re.M)


def plan_result(text: str) -> dict | None:
    """bench/plan.py prints a table, no JSON: its p50/p90 lines as a result."""
    found = {m[1]: {"p50": float(m[2]), "p90": float(m[3])} for m in PLAN_LINE.finditer(text)}
    if "plan" not in found:
        return None
    out = {"plan_ms": found["plan"]}
    if "compute_status" in found:
        out["status_ms"] = found["compute_status"]
    return out


def lookup(result: object, path: str) -> object:
    """The value at a dotted path (list indexes as numbers), None where it is missing."""
    cur = result
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def summary(value: object) -> dict | None:
    """{p50, p90, samples} of a figure's value: a number is its own p50; a summary gives what it holds."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return {"p50": float(value), "p90": None, "samples": [float(value)]}
    if isinstance(value, dict):
        samples = [float(x) for x in value.get("samples") or [] if isinstance(x, (int, float))]
        p50 = value.get("p50", percentile(samples, 50))
        p90 = value.get("p90")
        if isinstance(p50, (int, float)):
            return {"p50": float(p50), "p90": float(p90) if isinstance(p90, (int, float)) else None,
                    "samples": samples}
    return None


def extract(bench: str, result: dict | None) -> dict[str, dict]:
    """label -> summary, for every figure of `bench` its result holds (bench/cli_start.py: one per verb)."""
    if not result:
        return {}
    if bench == "cli_start":
        return {f"start-up: {verb}": {"p50": s["p50_ms"], "p90": s["p90_ms"], "samples": []}
                for verb, s in (result.get("verbs") or {}).items()}
    out = {}
    for f in FIGURES:
        if f.bench == bench and (s := summary(lookup(result, f.path))) is not None:
            out[f.label] = s
    return out


def described(bench: str, label: str) -> Figure:
    """The figure named `label` of `bench` (a CLI verb's start-up is described here, not in FIGURES)."""
    if bench == "cli_start":
        return Figure(bench, "verbs", label, "ms", "wall time of the command from exec until it exited (the "
                      "interpreter's start and imports included)")
    return next(f for f in FIGURES if f.bench == bench and f.label == label)
