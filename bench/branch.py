#!/usr/bin/env python3
"""Branch benchmark: how long a running child is paused by a live (by pages, the default, and by QEMU's
write-protect) vs diff vs full BRANCH, and how long until the branch is ready; the return time of a wait=False
(--no-wait) branch (live variants, and diff).

    FORKD_HOME=/dev/shm/fkb python3 bench/branch.py [--sizes 512,1536] [--reps 5] [-o json]

Per guest size: a warm snapshot `bench-branch-<MiB>` (created if missing), one source child per mode, in which a probe
thread in the agent's interpreter timestamps every ~1 ms (time.sleep(0.001)) and records every gap > 2 ms, while
that source is being branched (the other sources idle). For each
mode and repetition: QEMU's reported `downtime`, the host-side pause (live: QEMU's STOP->RESUME event stamps;
diff/full: our `stop` .. `cont`), the largest gap the guest probe saw during the branch call, and the time until
the snapshot is `ready`. Then wait=False branches (live variants, and diff): the time until the call returned.

Caveats printed with the results: under TCG the guest's clocks are QEMU's virtual clock, which does not advance
while the VM is stopped, so the guest probe cannot see a stop-the-world pause (it sees the jitter around it, and
the userfaultfd copy-on-write slowdowns of live mode). The guest-quiet baseline (the same probe over an equally
long window without a branch) is reported for comparison. Live mode needs FORKD_HOME on tmpfs (see README).
Progress goes to stderr; results to stdout. Every child and snapshot made here is removed (the base is kept).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from forkd.core.branch import branch, wait_background
from forkd.core.pipeline.branch import BranchJob
from forkd.core.requests import Branch, ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.vmm import capture
from forkd.vmm.agent_client import AgentClient
from forkd.vmm.capture import fs_type
from forkd.vmm.driver import RunFiles

PROBE = ("import threading, time\n"
         "PROBE_GAPS = []\n"
         "PROBE_ON = [False]\n"
         "def _probe():\n"
         "    last = time.monotonic()\n"
         "    while True:\n"
         "        if not PROBE_ON[0]:\n"  # the other modes' sources idle: they would load the host's 2 cores
         "            time.sleep(0.05)\n"
         "            last = time.monotonic()\n"
         "            continue\n"
         "        time.sleep(0.001)\n"
         "        now = time.monotonic()\n"
         "        if now - last > 0.002:\n"
         "            PROBE_GAPS.append((now, now - last))\n"
         "            del PROBE_GAPS[:-5000]\n"
         "        last = now\n"
         "threading.Thread(target=_probe, daemon=True).start()\n")
MODES = ("live", "live-wp", "diff", "full")  # live: by pages when it can (the default); live-wp: QEMU's write-protect
POLLED = "live-polled"  # --poll-ab: live-wp with the pre-issue-18 wait (query-migrate every 0.5 ms) instead of events
# each mode branches a source of its own: a write-protect branch reads all of guest RAM, which maps every page into
# the source's page tables, and a page scan (pages, diff) then walks them all
SOURCE = {"live": "pages", "live-wp": "wp", POLLED: "wp", "diff": "diff", "full": "full"}
RETURN_STEPS = ("prepare", "begin", "stage", "connect", "set_caps", "migrate_cmd", "stop_event_after_migrate",
                "stopped", "resumed", "pause", "capture", "capture_stop", "read_pages", "capture_devices",
                "prepare_pages", "pages")


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return statistics.median(xs) if p == 50 else xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def largest_gap(rt: Runtime, cid: str, g0: float, g1: float) -> float:
    gaps = json.loads(rt.eval(cid, f"__import__('json').dumps([g for t, g in PROBE_GAPS if t - g < {g1} and t > {g0}])")
                      ["value"].strip("'"))
    return max(gaps, default=0.0) * 1000.0


def probing(rt: Runtime, cid: str, on: bool) -> None:
    rt.exec_code(cid, f"PROBE_ON[0] = {on}")
    if on:
        time.sleep(0.2)


def guest_now(rt: Runtime, cid: str) -> float:
    return float(rt.eval(cid, "time.monotonic()")["value"])


def ensure_snapshot(rt: Runtime, mib: int) -> str:
    tag = f"bench-branch-{mib}"
    try:
        if rt.store.get(tag).status == "ready":
            return tag
        rt.store.remove(tag)
    except Exception:  # noqa: BLE001 - missing: create it
        pass
    progress(f"creating snapshot {tag} ({mib} MiB)")
    rt.create_snapshot(ParentBuild.of(tag=tag, memory_mib=mib, warm_imports=("decimal", "json")))
    return tag


@contextmanager
def live_capture(value: str):
    """FORKD_BRANCH_LIVE_CAPTURE=value for the branches inside (auto: by pages when it can)."""
    saved = os.environ.get("FORKD_BRANCH_LIVE_CAPTURE")
    os.environ["FORKD_BRANCH_LIVE_CAPTURE"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FORKD_BRANCH_LIVE_CAPTURE", None)
        else:
            os.environ["FORKD_BRANCH_LIVE_CAPTURE"] = saved


def branch_as(rt: Runtime, mode: str, req: Branch):
    """One branch; live-wp is live by QEMU's write-protect, POLLED that with capture.EVENT_POLL at 0.5 ms (how
    wait_resumed polled before)."""
    req = req.model_copy(update={"mode": mode.split("-")[0]})
    if mode not in ("live-wp", POLLED):
        with live_capture("auto"):
            return branch(rt, req)
    saved, capture.EVENT_POLL = capture.EVENT_POLL, 0.0005 if mode == POLLED else capture.EVENT_POLL
    try:
        with live_capture("write-protect"):
            return branch(rt, req)
    finally:
        capture.EVENT_POLL = saved


# --no-wait variants: (mode as in MODES, capabilities reset before each branch, return at the source's stop instead
# of its resume, the agent's ownership proved by a ping through the guest as before instead of by the open connection)
NOWAIT = {"before": ("live-wp", True, False, False), "caps-kept": ("live-wp", False, False, False),
          "now": ("live-wp", False, True, False), "pages": ("live", False, False, False),
          "diff-pinged": ("diff", False, False, True), "diff": ("diff", False, False, False)}
NOWAIT_WHAT = {"before": "live by write-protect, capabilities reset after each branch, returns after the resume "
                         "(before)",
               "caps-kept": "live by write-protect, capabilities kept, returns after the resume",
               "now": "live by write-protect, capabilities kept, returns at the stop",
               "pages": "live by pages (the default): returns once the source runs again",
               "diff-pinged": "diff, agent ownership proved by a ping through the guest (before)",
               "diff": "diff: returns once the source runs again (pages and device state taken)"}


def reset_caps(rt: Runtime, cid: str) -> None:
    """Put the source's migration capabilities back as a branch left them before issue 18's change (background
    snapshot off after every branch), so the next live branch pays QEMU's write-protect check again."""
    rec = rt.registry.get(cid)
    vm = rt.driver.attach(RunFiles(Path(rec.dir)), rec.pid, rec.started)
    try:
        rt.driver.connect(vm)
        capture.set_caps(vm.qmp, background_snapshot=False, x_ignore_shared=True)
    finally:
        rt.driver.release(vm)


def bench_size(rt: Runtime, mib: int, reps: int, modes: tuple[str, ...] = MODES) -> dict:
    tag = ensure_snapshot(rt, mib)
    # one source per branch mode (same snapshot, same probe): a live branch reads all of guest RAM, which maps
    # every page into the source's page tables, and a diff branch's page scan then walks them all
    srcs = {src: rt.fork(Spawn.of(tag=tag, n=1))[0].id for src in {SOURCE[m] for m in modes}}
    try:
        for cid in srcs.values():
            rt.exec_code(cid, PROBE)
        time.sleep(1.0)
        return {"memory_mib": mib, "modes": pauses(rt, srcs, mib, reps, modes),
                "nowait_return_ms": nowait_returns(rt, srcs, mib, reps, modes)}
    finally:
        wait_background(rt, 600)
        rt.kill(list(srcs.values()))


def pauses(rt: Runtime, srcs: dict[str, str], mib: int, reps: int, modes: tuple[str, ...]) -> dict:
    """Per mode: QEMU's downtime, the host-side pause, the guest's largest gap (and a quiet window's), ready time."""
    keys = ("qemu_downtime_ms", "host_pause_ms", "guest_gap_ms", "ready_ms", "baseline_gap_ms")
    rows = {mode: {k: [] for k in keys} for mode in modes}
    for i in range(reps):  # modes interleaved: load from other users of the host hits them alike
        for mode in modes:
            r = rows[mode]
            btag = f"bench-br-{mib}-{mode}-{i}"
            src = srcs[SOURCE[mode]]
            probing(rt, src, True)
            g0 = guest_now(rt, src)
            res = branch_as(rt, mode, Branch.of(child_id=src, tag=btag, wait=True))
            g1 = guest_now(rt, src)
            r["guest_gap_ms"].append(largest_gap(rt, src, g0, g1))
            r["qemu_downtime_ms"].append(res.qemu_downtime_ms)
            r["host_pause_ms"].append(res.timings_ms.get("pause"))
            r["ready_ms"].append(res.returned_ms)
            # noise floor: the same probe over an equally long quiet window
            b0 = guest_now(rt, src)
            time.sleep(max(0.0, g1 - g0))
            r["baseline_gap_ms"].append(largest_gap(rt, src, b0, guest_now(rt, src)))
            probing(rt, src, False)
            assert res.snapshot.status == "ready", res.snapshot.error
            assert mode != "live" or res.capture == "pages", res.capture_note
            rt.store.remove(btag)
            progress(f"{mib} MiB {mode} #{i + 1} ({res.capture}): downtime {res.qemu_downtime_ms} ms, pause "
                     f"{r['host_pause_ms'][-1]:.1f} ms, guest gap {r['guest_gap_ms'][-1]:.1f} ms, "
                     f"ready {res.returned_ms:.0f} ms")
    return {mode: {k: {"p50": pct(v, 50), "p90": pct(v, 90), "samples": v} for k, v in rows[mode].items()}
            for mode in modes}


def nowait_returns(rt: Runtime, srcs: dict[str, str], mib: int, reps: int, modes: tuple[str, ...]) -> dict:
    """Per --no-wait variant (NOWAIT) whose mode runs: when the call returned, and its steps (p50)."""
    returns: dict[str, list[float]] = {v: [] for v in NOWAIT}
    steps: dict[str, list[dict]] = {v: [] for v in NOWAIT}
    for i in range(reps):  # the variants interleaved
        for variant, (mode, reset, at_stop, ping) in NOWAIT.items():
            if mode not in modes:
                continue
            src = srcs[SOURCE[mode]]
            if reset:
                reset_caps(rt, src)
            btag = f"bench-br-{mib}-nowait-{variant}-{i}"
            probing(rt, src, True)
            saved, BranchJob.returns_at_stop = BranchJob.returns_at_stop, property(lambda job, s=at_stop: s)
            saved_accepted = AgentClient._accepted_by
            if ping:  # replays the ping owned() made on every branch before (the kernel "cannot say")
                AgentClient._accepted_by = lambda client, deadline: None
            try:
                res = branch_as(rt, mode, Branch.of(child_id=src, tag=btag, wait=False))
            finally:
                BranchJob.returns_at_stop, AgentClient._accepted_by = saved, saved_accepted
            probing(rt, src, False)
            returns[variant].append(res.returned_ms)
            steps[variant].append(dict(res.timings_ms))  # copied now: the background conversion adds to it
            res.thread.join(600)
            assert rt.store.get(btag).status == "ready", rt.store.get(btag).error
            rt.store.remove(btag)
            progress(f"{mib} MiB {mode} --no-wait #{i + 1} ({variant}): returned in {res.returned_ms:.1f} ms")
    return {v: {"p50": pct(r, 50), "p90": pct(r, 90), "samples": r,
                "steps_p50_ms": {k: pct([s[k] for s in steps[v] if k in s], 50)
                                 for k in sorted({k for s in steps[v] for k in s})}}
            for v, r in returns.items() if r}


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="512,1536", help="guest sizes in MiB, comma-separated (default 512,1536)")
    ap.add_argument("--reps", type=int, default=5, help="branches per mode and size (default 5)")
    ap.add_argument("--modes", help=f"comma-separated subset of {', '.join(MODES)} (default: all; live is by pages "
                                   "when it can, live-wp by QEMU's write-protect)")
    ap.add_argument("--poll-ab", action="store_true",
                    help=f"also run {POLLED!r}: live with the old 0.5 ms query-migrate polling, interleaved")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args()
    modes = tuple(args.modes.split(",")) if args.modes else MODES
    modes = (*modes, POLLED) if args.poll_ab else modes
    rt = Runtime()
    kind = fs_type(rt.layout.snapshots)
    if kind not in ("tmpfs", "hugetlbfs"):
        progress(f"warning: FORKD_HOME snapshots are on {kind}: live mode needs tmpfs and will be refused")
    results = {"home_fs": kind, "sizes": [bench_size(rt, int(s), args.reps, modes) for s in args.sizes.split(",")]}
    if args.output == "json":
        print(json.dumps(results, indent=2))
        return
    print(f"forkd branch benchmark (accel from the snapshot; reps={args.reps}; FORKD_HOME on {kind})")
    print(f"{'MiB':>5} {'mode':<7} {'qemu downtime p50/p90':>22} {'host pause p50/p90':>19} "
          f"{'guest gap p50/p90':>18} {'quiet gap p50':>13} {'ready p50':>10}")
    for size in results["sizes"]:
        m = size["modes"]
        for mode in m:
            r = m[mode]
            print(f"{size['memory_mib']:>5} {mode:<7} "
                  f"{fmt(r['qemu_downtime_ms']['p50']):>10}/{fmt(r['qemu_downtime_ms']['p90']):<11} "
                  f"{fmt(r['host_pause_ms']['p50']):>9}/{fmt(r['host_pause_ms']['p90']):<9} "
                  f"{fmt(r['guest_gap_ms']['p50']):>8}/{fmt(r['guest_gap_ms']['p90']):<9} "
                  f"{fmt(r['baseline_gap_ms']['p50']):>13} {fmt(r['ready_ms']['p50']):>10}")
        wp = m["live-wp"]["host_pause_ms"]["p50"] if "live-wp" in m else None
        ratios = ", ".join(f"{mode} {wp / m[mode]['host_pause_ms']['p50']:.2f}x" for mode in (*MODES, POLLED)
                           if wp and mode in m and mode != "live-wp")
        print(f"      host pause, live by write-protect / other mode (p50): {ratios}")
        nw = size["nowait_return_ms"]
        for v, what in NOWAIT_WHAT.items():
            if v not in nw:
                continue
            print(f"      --no-wait, {what}: p50 {fmt(nw[v]['p50'])} ms, p90 {fmt(nw[v]['p90'])} ms")
            print("          steps p50 (ms): " + ", ".join(f"{k} {fmt(x)}" for k, x in nw[v]["steps_p50_ms"].items()
                                                       if k in RETURN_STEPS))
        if "now" in nw and nw["now"]["p50"]:
            print(f"      >>> --no-wait before / now (p50) = {nw['before']['p50'] / nw['now']['p50']:.2f}x")
        if "now" in nw and "diff" in nw and nw["diff"]["p50"]:
            print(f"      >>> --no-wait live (at the stop) / diff (p50) = {nw['now']['p50'] / nw['diff']['p50']:.2f}x")
        if "diff-pinged" in nw and "diff" in nw and nw["diff"]["p50"]:
            print(f"      >>> --no-wait diff pinged / diff (p50) = {nw['diff-pinged']['p50'] / nw['diff']['p50']:.2f}x"
                  f"; diff p50 {fmt(nw['diff']['p50'])} ms, p90 {fmt(nw['diff']['p90'])} ms (target <= 20 ms)")
        if "pages" in nw and "now" in nw and nw["pages"]["p50"]:
            print(f"      >>> --no-wait live by write-protect (at the stop) / by pages (p50) = "
                  f"{nw['now']['p50'] / nw['pages']['p50']:.2f}x; by pages p50 {fmt(nw['pages']['p50'])} ms, p90 "
                  f"{fmt(nw['pages']['p90'])} ms (target <= 20 ms)")
        for mode in ("live", "diff"):
            if mode in m:
                d = m[mode]["host_pause_ms"]
                print(f"      >>> {mode} pause p50 {fmt(d['p50'])} ms, p90 {fmt(d['p90'])} ms (target <= 10 ms)")
    print("note: under TCG the guest clock stops while the VM is stopped, so the guest probe cannot see a "
          "stop-the-world pause; host pause is the honest figure for diff/full.")


if __name__ == "__main__":
    main()
