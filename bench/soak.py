#!/usr/bin/env python3
"""Soak benchmark: a pool under steady churn for N minutes, watched for leaks.

    python3 bench/soak.py [--minutes 10] [--interval 60] [--image-from HOME] [--no-faults] [--out DIR] [-o json]
    python3 bench/soak.py --minutes 60 --label hour   # the one-hour soak, faults interleaved, dated report
    python3 bench/soak.py --short          # CI: 1 minute, a sample every 10 s

A daemon (`forkd serve`) on a private $FORKD_HOME (the guest image copied from --image-from) runs a pool of 2 warm
256 MiB children. One client loops, through the daemon's socket: claim a child, exec in it, every third cycle a
live branch of it (the branch snapshot is deleted again), then release it (kill); the pool refills behind it.
Every interval it samples the daemon's RSS and its swapped-out memory (a host short of memory swaps the daemon
out and its RSS falls: the two together are what it holds), its open fds, the bytes this home holds on tmpfs (flat
images, scratch RAM) and the leftover count (what `forkd gc --dry-run` would remove, plus entries in
$FORKD_HOME/tmp, plus QEMU processes of this home without a live record). Each series must stay flat: the script
prints each one's least-squares slope per minute over the whole run and over its second half (growth that
saturates, such as a flat image's holes being filled once, is not a leak), and FLAT or GROWING.

Faults (tests/faults/inject.py), one every --fault-every cycles in turn, each checked against its promise (and,
after it, the pool back at its target: a pool that stops moving short of it for a stall budget broke the promise)
and counted held or broken in the report: a claimed child's VMM stopped (SIGSTOP) and then killed; the tmpfs of flat
images (FORKD_SHM on a size-limited tmpfs this script mounts) filled while a spawn needs it; $FORKD_HOME (made on
a loop-mounted ext4 of --home-mib this script mounts) filled with a ballast file during a live branch, a layer
build and a pack unpack; and with --kill-daemon, the daemon kill -9'd and restarted (off by default: a new
daemon's RSS and fds start afresh, which breaks those two series; tests/chaos and bench/chaos.py kill it hundreds
of times). Mounting needs root: as another user the two mounted faults are left out.

The daemon is SIGKILLed by the kernel if this script dies (PR_SET_PDEATHSIG, tests/chaos/rig.py), so a soak
killed with -9 leaves no daemon serving a deleted home.

The report, `<out>/soak-<UTC date>[-LABEL].md` (and `.json`; none with --short), is rewritten at every sample,
with a status line (in progress, complete, stopped early), so a run stopped early still leaves one.

Left out: the first sample is taken after the pool is full and one warm-up cycle ran (start-up allocations are
not a leak); the client's own memory; children other than the pool's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.client.remote import RemoteBackend  # noqa: E402
from forkd.core.requests import Branch  # noqa: E402
from forkd.core.runtime import Runtime  # noqa: E402
from tests.chaos.invariants import home_qemu_pids  # noqa: E402
from tests.chaos.rig import SPEC, Rig  # noqa: E402
from tests.faults import inject  # noqa: E402
from tests.faults.mounts import loop_ext4, small_tmpfs  # noqa: E402

SERIES = ("rss_mib", "swap_mib", "fds", "tmpfs_mib", "leftovers")


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tmpfs_bytes(layout: Layout) -> int:
    total = 0
    shm = layout.shm_dir
    for root, _dirs, files in os.walk(shm) if shm is not None else ():
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def sample(rig: Rig, rt: Runtime) -> dict[str, float]:
    pid = rig.daemon_pid()
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in status.splitlines())
           if k in ("VmRSS", "VmSwap")}
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rep = rt.gc(dry_run=True)
    live = {r.pid for r in rt.registry.list() if r.alive}
    stray_qemu = [p for p in home_qemu_pids(rt.layout.home) if p not in live]
    tmp = len(os.listdir(rt.layout.tmp)) if rt.layout.tmp.is_dir() else 0
    return {"t_min": time.monotonic() / 60, "load1": os.getloadavg()[0], "rss_mib": kib["VmRSS"] / 1024,
            "swap_mib": kib.get("VmSwap", 0) / 1024, "fds": fds,
            "tmpfs_mib": tmpfs_bytes(rt.layout) / (1 << 20), "leftovers": rep["leftovers"] + tmp + len(stray_qemu),
            "children": len(rt.registry.list())}


def slope(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    return statistics.linear_regression(xs, ys).slope


class Churn:
    def __init__(self, api: RemoteBackend, pool: str):
        self.api, self.pool = api, pool
        self.cycles = self.branches = self.failures = 0
        self.latency_ms: list[float] = []

    def cycle(self) -> None:
        t0 = time.perf_counter()
        cid = None
        try:
            cid = self.api.claim(self.pool, 1)[0]["id"]
            self.api.exec(cid, ["sh", "-c", "echo churn > /root/c; cat /root/c"], timeout=60)
            if self.cycles % 3 == 2:
                tag = f"soak-br-{self.cycles}"
                self.api.branch(Branch(child_id=cid, tag=tag, mode="live"))
                self.api.rmi(tag)
                self.branches += 1
        except Exception as exc:  # noqa: BLE001 - counted and reported, the soak goes on
            self.failures += 1
            log(f"cycle {self.cycles} failed: {type(exc).__name__}: {exc}")
        finally:
            if cid:
                try:
                    self.api.kill([cid])
                except Exception as exc:  # noqa: BLE001
                    self.failures += 1
                    log(f"kill {cid} failed: {exc}")
            self.cycles += 1
            self.latency_ms.append((time.perf_counter() - t0) * 1000)


def wait_warm(rig: Rig, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pools = rig.pools()
            if pools and all((p.get("status") or {}).get("warm") == p["spec"]["warm"] for p in pools):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the pool never filled: {rig.daemon_log_tail()}")


class Faults:
    """The fault injections, one every `every` cycles in turn; their outcomes."""

    def __init__(self, rig: Rig, rt: Runtime, api: RemoteBackend, pool: str, every: int, shm: Path | None,
                 kill_daemon: bool, pack_file: Path | None = None):
        """`pack_file` (outside the home) is where the full-home fault keeps its pack: given when $FORKD_HOME is a
        filesystem of its own this script may fill."""
        self.rig, self.rt, self.api, self.pool, self.every = rig, rt, api, pool, every
        self.kinds = ["hung_vmm"] + (["tmpfs_full"] if shm is not None else []) + \
            (["home_full"] if pack_file is not None else []) + (["daemon_kill"] if kill_daemon else [])
        self.shm, self.pack_file = shm, pack_file
        self.outcomes: list[inject.Outcome] = []
        self.clock, self.sleep = time.monotonic, time.sleep  # what the wait for the pools to refill runs on

    def maybe(self, cycle: int) -> None:
        if not self.every or cycle % self.every != self.every - 1:
            return
        kind = self.kinds[len(self.outcomes) % len(self.kinds)]
        try:
            if kind == "hung_vmm":
                out = inject.hung_vmm(self.api, self.rt, self.pool)
            elif kind == "tmpfs_full":
                out = inject.tmpfs_full(self.api, self.rt, self.pool, self.shm, cycle)
            elif kind == "home_full":
                out = inject.home_full(self.api, self.rt, self.pool, parent_tag(self.rt), self.pack_file, cycle)
            else:
                out = inject.daemon_kill(self.api, self.rig, self.pool, wait_warm)
        except Exception as exc:  # noqa: BLE001 - a fault that could not even be set up is a broken promise too
            out = inject.Outcome(kind, [f"{type(exc).__name__}: {exc}"])
        refill = inject.refilled(out, self.rt, self.rig.pools, clock=self.clock, sleep=self.sleep)
        self.outcomes.append(out)
        log(f"fault {kind}: {'held' if out.held else 'BROKEN: ' + '; '.join(out.broken)} ({out.seconds:.1f} s, "
            + (f"pools back {refill:.1f} s later)" if refill is not None else "pools not back)"))

    def summary(self) -> dict:
        out: dict = {}
        for o in self.outcomes:
            d = out.setdefault(o.fault, {"injected": 0, "held": 0, "broken": []})
            d["injected"] += 1
            d["held"] += o.held
            d["broken"] += o.broken
        return out


def parent_tag(rt: Runtime) -> str:
    """The pool's parent snapshot (the rig's ForkParent `cx-p`): what the full-home fault builds a layer on."""
    tags = [s.tag for s in rt.store.list() if getattr(s, "status", None) == "ready" and s.tag.startswith("cx-p-")]
    if not tags:
        raise RuntimeError("no ready snapshot of ForkParent cx-p")
    return tags[0]


def soak(rig: Rig, minutes: float, interval: float, faults_every: int, shm: Path | None, kill_daemon: bool,
         report=None, pack_file: Path | None = None, only: list[str] | None = None) -> dict:
    """The churn (and faults) for `minutes`; `report(result)` is called at every sample with the result so far."""
    rig.start_daemon()
    res = rig.apply(SPEC.format(warm=2, max_children=6))
    if res.returncode != 0:
        raise SystemExit(f"forkd apply failed: {res.stderr}")
    wait_warm(rig)
    rt = Runtime(Layout(rig.home))
    api = RemoteBackend(str(rt.layout.daemon_socket))
    churn = Churn(api, "cx-a")
    faults = Faults(rig, rt, api, "cx-a", faults_every, shm, kill_daemon, pack_file)
    if only:
        if unknown := set(only) - set(faults.kinds):
            raise SystemExit(f"--faults: {', '.join(sorted(unknown))} cannot be injected here (possible: "
                             f"{', '.join(faults.kinds)}; the mounted ones need root)")
        faults.kinds = [k for k in faults.kinds if k in only]
    churn.cycle()  # warm-up, not sampled
    samples = [sample(rig, rt)]
    end = time.monotonic() + minutes * 60
    next_at = time.monotonic() + interval
    while time.monotonic() < end:
        churn.cycle()
        faults.maybe(churn.cycles)
        if time.monotonic() >= next_at:
            samples.append(sample(rig, rt))
            log(f"sample {len(samples)}: " + ", ".join(f"{k} {samples[-1][k]:.1f}" for k in SERIES))
            next_at += interval
            if report is not None:
                report(result(churn, faults, samples, interval))
    samples.append(sample(rig, rt))
    return result(churn, faults, samples, interval)


def result(churn: Churn, faults: Faults, samples: list[dict], interval: float) -> dict:
    t0 = samples[0]["t_min"]
    xs = [s["t_min"] - t0 for s in samples]
    out = {"minutes": xs[-1], "interval_s": interval, "cycles": churn.cycles, "branches": churn.branches,
           "failures": churn.failures, "cycle_ms_p50": statistics.median(churn.latency_ms),
           "faults": faults.summary(), "samples": samples,
           "slopes_per_min": {k: slope(xs, [s[k] for s in samples]) for k in SERIES}}
    half = len(samples) // 2  # the second half alone: growth that saturates (a cache filling) is not a leak
    out["late_slopes_per_min"] = {k: slope(xs[half:], [s[k] for s in samples[half:]]) for k in SERIES}
    out["change"] = {k: samples[-1][k] - samples[0][k] for k in SERIES}
    return out


def verdict(res: dict, key: str) -> str:
    """FLAT when the second half of the run grows by less than 5% of the first sample (or a small absolute
    amount); leftovers must end at 0."""
    first = res["samples"][0][key]
    grew = res["late_slopes_per_min"][key] * res["minutes"] / 2
    if key == "leftovers":
        return "FLAT" if res["samples"][-1][key] == 0 and grew <= 0.5 else "GROWING"
    return "FLAT" if grew <= max(0.05 * first, {"rss_mib": 8.0, "swap_mib": 8.0, "fds": 3, "tmpfs_mib": 4.0}[key]) \
        else "GROWING"


def text(res: dict) -> str:
    lines = [f"forkd soak: {res['minutes']:.1f} min of churn on a pool of 2 warm 256 MiB children (TCG, 2 cores): "
             f"{res['cycles']} claim/exec/release cycles ({res['branches']} with a live branch), "
             f"{res['failures']} failed; cycle p50 {res['cycle_ms_p50']:.0f} ms; {len(res['samples'])} samples"]
    for k in SERIES:
        s = res["samples"]
        lines.append(f"  {k:10s} first {s[0][k]:7.1f}  last {s[-1][k]:7.1f}  slope {res['slopes_per_min'][k]:+7.2f}/min"
                     f"  second half {res['late_slopes_per_min'][k]:+7.2f}/min  {verdict(res, k)}")
    loads = [s["load1"] for s in res["samples"] if "load1" in s]
    if loads:
        lines.append(f"  host load average (1 min) at the samples: min {min(loads):.1f}, median "
                     f"{statistics.median(loads):.1f}, max {max(loads):.1f}")
    for kind, f in sorted(res["faults"].items()):
        lines.append(f"  fault {kind:11s} injected {f['injected']}, promise held {f['held']}")
        lines += [f"      broken: {b[:300]}" for b in f["broken"]]
    if res.get("leaked_qemu_at_end"):
        lines.append(f"  QEMU processes left at the end (killed): {res['leaked_qemu_at_end']}")
    return "\n".join(lines)


class Report:
    """The dated report, rewritten at every sample: `<out>/soak-<UTC date>[-LABEL].md` and `.json`."""

    def __init__(self, out: Path, label: str):
        self.day = time.strftime("%Y-%m-%d", time.gmtime())
        self.started = time.strftime("%H:%M UTC", time.gmtime())
        self.path = out / (f"soak-{self.day}" + (f"-{label}" if label else ""))
        self.cmdline = "python3 bench/soak.py " + " ".join(sys.argv[1:])
        out.mkdir(parents=True, exist_ok=True)

    def write(self, res: dict, status: str) -> None:
        from forkd.base.atomic import write_bytes

        now = time.strftime("%H:%M UTC", time.gmtime())
        head = (f"# Soak under churn with faults, {self.day}\n\nCommand: `{self.cmdline}`\n\nStatus: {status}; "
                f"started {self.started}, last written {now}\n\n```\n")
        write_bytes(self.path.with_suffix(".md"), (head + text(res) + "\n```\n").encode(), durable=False)
        write_bytes(self.path.with_suffix(".json"), (json.dumps(
            {"date": self.day, "command": self.cmdline, "status": status, **res}, indent=2) + "\n").encode(),
            durable=False)


def tracemalloc_diff(a: Path, b: Path, top: int = 15) -> int:
    """What grew from snapshot `a` to `b` (bench/lib/tracemalloc_site), by the line that allocated it."""
    import tracemalloc

    skip = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._*>")]
    sa, sb = (tracemalloc.Snapshot.load(str(p)).filter_traces(skip) for p in (a, b))
    print(f"traced: {sum(t.size for t in sa.traces) / 2**20:.1f} -> {sum(t.size for t in sb.traces) / 2**20:.1f} MiB")
    for st in sb.compare_to(sa, "traceback")[:top]:
        print(f"{st.size_diff / 2**20:+8.2f} MiB {st.count_diff:+7d} blocks (now {st.size / 2**20:.2f} MiB)")
        print("\n".join("      " + line for line in st.traceback.format()[-8:]))
    return 0


def _stop(signum, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--short", action="store_true", help="1 minute, a sample every 10 s (CI)")
    ap.add_argument("--image-from", type=Path, default=settings().home,
                    help="copy the guest image from this home (default: $FORKD_HOME)")
    ap.add_argument("--no-faults", action="store_true", help="churn only, no fault injected")
    ap.add_argument("--fault-every", type=int, default=6, help="cycles between two faults")
    ap.add_argument("--kill-daemon", action="store_true", help="kill -9 and restart the daemon among the faults")
    ap.add_argument("--faults", default="", metavar="KIND,...",
                    help="inject only these (hung_vmm, tmpfs_full, home_full, daemon_kill); default: every one the "
                         "host and flags allow")
    ap.add_argument("--shm-mib", type=int, default=2048, help="size of the tmpfs of flat images (tmpfs fault)")
    ap.add_argument("--home-mib", type=int, default=4096,
                    help="size of the loop-mounted ext4 $FORKD_HOME is made on (full-home fault)")
    ap.add_argument("--out", type=Path, help="directory of the dated report (default: bench/reports; none with "
                                             "--short unless given)")
    ap.add_argument("--label", default="", help="report name suffix: <out>/soak-<UTC date>[-LABEL].md")
    ap.add_argument("--tracemalloc", type=Path, metavar="DIR",
                    help="trace the daemon's Python allocations: a snapshot in DIR every 30 s from its first minute "
                         "(bench/lib/tracemalloc_site); slows the daemon")
    ap.add_argument("--tracemalloc-diff", nargs=2, type=Path, metavar=("A", "B"),
                    help="print what grew from snapshot A to snapshot B, by line, and exit")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    if args.tracemalloc_diff:
        return tracemalloc_diff(*args.tracemalloc_diff)
    if args.tracemalloc:
        args.tracemalloc.mkdir(parents=True, exist_ok=True)
        os.environ["FORKD_SOAK_TRACEMALLOC"] = str(args.tracemalloc.absolute())
        site = Path(__file__).resolve().parent / "lib" / "tracemalloc_site"  # the rig's daemon inherits PYTHONPATH
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    if args.short:
        args.minutes, args.interval = 1.0, 10.0
    signal.signal(signal.SIGTERM, _stop)
    out = args.out or (None if args.short else Path(__file__).resolve().parent / "reports")
    report = Report(out, args.label) if out is not None else None
    every = 0 if args.no_faults else args.fault_every
    with contextlib.ExitStack() as stack:
        shm = home = pack_file = None
        if every and os.geteuid() == 0:
            shm = stack.enter_context(small_tmpfs(args.shm_mib))
            os.environ["FORKD_SHM"] = str(shm)  # the rig's daemon and CLI inherit it
            home = stack.enter_context(loop_ext4(args.home_mib)) / "home"
            keep_dir = Path(tempfile.mkdtemp(prefix="fksoak-", dir="/tmp"))  # beside the home, not on it
            pack_file = keep_dir / "full-home.tar.zst"
            stack.callback(shutil.rmtree, keep_dir, ignore_errors=True)
        rig = Rig.create(home=home, image_from=args.image_from)
        if home is not None:  # the daemon's log must not share the filesystem that is filled
            rig.log_path = Path(tempfile.mkstemp(prefix="fksoak-", suffix="-daemon.log", dir="/tmp")[1])
            log(f"$FORKD_HOME {home} (loop-mounted ext4, {args.home_mib} MiB); daemon log {rig.log_path}")
        last: dict = {}

        def keep(res: dict) -> None:
            last.update(res)
            if report is not None:
                report.write(res, "in progress")

        status = "complete"
        try:
            res = soak(rig, args.minutes, args.interval, every, shm, args.kill_daemon, keep, pack_file,
                       [k for k in args.faults.split(",") if k])
        except KeyboardInterrupt:
            res, status = last, "stopped early"
        finally:
            leaked = rig.destroy()
    if not res:
        print("stopped before the first sample: no report", file=sys.stderr)
        return 2
    res["leaked_qemu_at_end"] = leaked
    if report is not None:
        report.write(res, status)
    print(json.dumps(res, indent=2) if args.output == "json" else text(res))
    broken = any(f["broken"] for f in res["faults"].values())
    return 2 if status != "complete" else 1 if broken or leaked else 0


if __name__ == "__main__":
    sys.exit(main())
