#!/usr/bin/env python3
"""Test rollouts: N patched copies of a project run its tests, forked from a warm parent vs cold boots vs podman.

    python3 bench/rollouts.py [--n 8,32] [--sides fork,cold,podman] [--memory-mib 512]
                              [--image-from HOME] [--report-dir bench/reports] [-o json]

The project (bench/lib/project.py: a small pure-Python package, its unittest suite, two dependency wheels from the
package index) is checked out and its dependencies installed once in a parent; each of N rollouts applies its own
small patch (a third keep the tests passing) and runs the tests. All N start at once; the figure is the time from
the start to the last result, and the host CPU it took. Each side runs in a cgroup of its own weighted as N
ordinary processes, forkd's children included (unconstrained, out of forkd's own cgroups), so each gets the same
share of a shared host (bench/lib/cpuacct.py says why).

  fork    N children forked from the warm parent (a snapshot of a child of the base VM that holds the checked-out
          project with its dependencies), each patching and testing in place, in this process's runtime;
  cold    N fresh VMs booted from the same guest image (no snapshot): each gets the project's files, checks it
          out, installs the dependencies, patches and tests (with no snapshot, the setup runs in every VM);
  podman  N containers (`podman run --rm`, runc) of an image holding the guest's own rootfs with the project
          checked out and installed (the container counterpart of the warm parent), each patching and testing.

Runs in a private $FORKD_HOME (the guest image copied from --image-from), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.lib import cpuacct, podman, project  # noqa: E402
from bench.lib.reports import fmt, host_facts, percentile, ratio, write_report  # noqa: E402

SIDES = ("fork", "cold", "podman")
PROJ = "/root/proj"  # where the parent (and the container image) holds the checked-out project
ROLLOUT = ('cd "$1" && sed -i "$2" tally/core.py && if PYTHONPATH=.deps:. python3 -m unittest -q 2> test.log; '
           'then echo ok; else echo fail; fi')


def log(msg: str) -> None:
    print(f"[rollouts {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rollout_argv(patch: str) -> list[str]:
    return ["/bin/sh", "-c", ROLLOUT, "rollout", PROJ, patch]


def expected(patches: list[str]) -> list[str]:
    return ["ok" if p.endswith("SCALE = 1/") else "fail" for p in patches]


def timed_all(n: int, one, parallel: int) -> tuple[float, list[float], list[str]]:
    """Run `one(i)` for i < n, `parallel` at once; (wall s to the last result, each one's s from the start,
    results)."""
    t0 = time.monotonic()

    def run(i: int) -> tuple[float, str]:
        out = one(i)
        return time.monotonic() - t0, out

    with ThreadPoolExecutor(max_workers=parallel) as ex:
        done = list(ex.map(run, range(n)))
    return time.monotonic() - t0, [d[0] for d in done], [d[1] for d in done]


def summarise(side: str, n: int, wall: float, each: list[float], outs: list[str], want: list[str],
              cpu: float | None) -> dict:
    right = sum(1 for o, w in zip(outs, want, strict=True) if o == w)
    log(f"{side} x{n}: {wall:.1f} s to all results, CPU {fmt(cpu, '.1f')} s, {right}/{n} as expected")
    return {"side": side, "n": n, "wall_s": wall, "cpu_s": cpu, "as_expected": right,
            "each_s": {"p50": percentile(each, 50), "p90": percentile(each, 90)},
            "unexpected": [o for o, w in zip(outs, want, strict=True) if o != w][:3]}


def measure(side: str, n: int, runner, group) -> dict:
    """One side's N rollouts; a side that fails (e.g. a guest that panics while booting on a starved host) is
    recorded with its error, and the other sides still run."""
    patches = project.patches(n)
    cpu0 = group.usage_s() if group else None
    try:
        wall, each, outs = runner(patches)
    except Exception as exc:  # noqa: BLE001 - reported in the result, the run goes on
        log(f"{side} x{n} failed: {str(exc).splitlines()[0][:300]}")
        return {"side": side, "n": n, "wall_s": None, "cpu_s": None, "as_expected": 0,
                "each_s": {"p50": None, "p90": None}, "error": str(exc)[:2000]}
    cpu = group.usage_s() - cpu0 if group else None
    return summarise(side, n, wall, each, outs, expected(patches), cpu)


# -- podman --------------------------------------------------------------------------------------------------

def podman_image(staged: Path, initrd: Path, cid: str) -> str:
    """The guest rootfs with the project checked out and installed at PROJ (one container run, committed)."""
    name = f"localhost/forkd-bench:rollouts-{cid}"
    if subprocess.run(["podman", "image", "exists", name]).returncode == 0:
        return name
    base = podman.image_from_initrd(initrd, staged, project.ROOT, cid)
    res = subprocess.run([*podman.run_argv(base, None, "--name", f"forkd-bench-setup-{cid}"),
                          *project.sample_argv(project.ROOT, PROJ)], capture_output=True, text=True)
    try:
        if "ok" not in res.stdout:
            raise RuntimeError(f"the project's setup failed in a container: {res.stdout} {res.stderr[-1000:]}")
        subprocess.run(["podman", "commit", "-q", f"forkd-bench-setup-{cid}", name], check=True,
                       capture_output=True)
    finally:
        subprocess.run(["podman", "rm", "-f", f"forkd-bench-setup-{cid}"], capture_output=True)
    return name


def podman_runner(image: str, group, parallel: int):
    def one(patch: str) -> str:
        argv = [*podman.run_argv(image, group.rel if group else None, "--rm"), *rollout_argv(patch)]
        res = subprocess.run(group.wrap(argv) if group else argv, capture_output=True, text=True, timeout=3600)
        return res.stdout.strip() or f"exit {res.returncode}: {res.stderr[-300:]}"

    return lambda patches: timed_all(len(patches), lambda i: one(patches[i]), parallel)


# -- forkd: the warm parent, forks, cold boots ----------------------------------------------------------------

class Vms:
    """A private home's runtime (this process is the only writer), its base snapshot and the warm parent."""

    def __init__(self, image_from: Path, memory_mib: int):
        from forkd.base.paths import Layout
        from forkd.core.runtime import Runtime
        from tests.chaos.rig import seed_home

        self.home = Path(tempfile.mkdtemp(prefix="fkroll", dir="/tmp"))
        seed_home(self.home, image_from)
        self.rt = Runtime(Layout(self.home))
        self.memory_mib = memory_mib
        self.image, _ = self.rt.build_image(log)
        self.decision, _ = self.rt.accelerator(self.image, log)

    def machine(self):
        from forkd.vmm.driver import Machine

        return Machine(kernel=self.image.kernel, initrd=self.image.initrd, memory_mib=self.memory_mib,
                       accel=self.decision.accel)

    def parent(self, files: dict[str, bytes], tag: str) -> str:
        """Snapshot `tag`: a child of a fresh base snapshot with the project checked out and installed at PROJ."""
        from forkd.core.requests import Branch, ParentBuild, Spawn

        log(f"booting the base snapshot ({self.memory_mib} MiB)")
        self.rt.create_snapshot(ParentBuild.of(tag="rollout-base", memory_mib=self.memory_mib), progress=log)
        [child] = self.rt.fork(Spawn(tag="rollout-base", n=1, timeout=600))
        try:
            with self.rt.agent(child.id) as a:
                setup(a, files)
            self.rt.branch(Branch(child_id=child.id, tag=tag, mode="live", wait=True))
        finally:
            self.rt.kill([child.id])
        log(f"warm parent {tag} ready")
        return tag

    def fork_runner(self, tag: str, parallel: int):
        from forkd.core.requests import Spawn

        def run(patches: list[str]):
            t0 = time.monotonic()
            kids = self.rt.fork(Spawn(tag=tag, n=len(patches), timeout=1800))
            spawn = time.monotonic() - t0
            try:
                def one(i: int) -> str:
                    with self.rt.agent(kids[i].id, timeout=600) as a:
                        return a.exec(rollout_argv(patches[i]), timeout=1800)["stdout"].strip()

                wall, each, outs = timed_all(len(patches), one, parallel)
            finally:
                self.rt.kill([k.id for k in kids])
            return spawn + wall, [spawn + e for e in each], outs

        return run

    def cold_runner(self, files: dict[str, bytes], parallel: int):
        from forkd.base.paths import tmpfs
        from forkd.vmm.driver import RunFiles

        def one(i: int, patch: str) -> str:
            work = self.rt.layout.tmp / f"cold-{os.getpid()}-{i}-{time.monotonic_ns()}"
            mem = (tmpfs() or work) / f"forkd-{work.name}.mem"
            vm = None
            try:
                work.mkdir(parents=True)
                vm = self.rt.driver.boot(self.machine(), mem, RunFiles(work), timeout=1800)
                return setup(vm.agent, files, patch)
            finally:
                if vm is not None:
                    self.rt.driver.stop(vm)
                mem.unlink(missing_ok=True)
                shutil.rmtree(work, ignore_errors=True)

        return lambda patches: timed_all(len(patches), lambda i: one(i, patches[i]), parallel)

    def close(self) -> None:
        try:
            self.rt.kill(all_=True)
        finally:
            from forkd.base.paths import Layout

            shutil.rmtree(Layout(self.home).flat_cache.parent, ignore_errors=True)
            shutil.rmtree(self.home, ignore_errors=True)


def setup(agent, files: dict[str, bytes], patch: str = "") -> str:
    """Upload the staged files through `agent`, check the project out at PROJ, install, (patch,) test: 'ok'/'fail'."""
    agent.exec(["mkdir", "-p", f"{project.ROOT}/wheels"])
    for rel, data in files.items():
        agent.write_file(f"{project.ROOT}/{rel}", data)
    res = agent.exec(project.sample_argv(project.ROOT, PROJ, patch), timeout=1800)
    out = res["stdout"].strip().split(" ")[0]
    if not patch and out != "ok":
        raise RuntimeError(f"the project's setup failed in a VM: {res['stdout']} {res['stderr'][-1000:]}")
    return out


# -- the comparison ---------------------------------------------------------------------------------------

def compare(args: argparse.Namespace) -> dict:
    groups = {s: cpuacct.CpuGroup.make(s, weight=args.parallel) for s in ("vm", "podman")}
    if groups["vm"] is not None:
        groups["vm"].join()  # this process starts the VMMs of both VM sides; they inherit its group
    skipped: dict[str, str] = {}
    vms = None
    runs: list[dict] = []
    host_before = host_facts()
    with tempfile.TemporaryDirectory(prefix="forkd-bench-stage-") as tmp:
        files = project.stage(Path(tmp), args.wheel_cache)
        cid = project.content_id(files)
        try:
            runners = {}
            if "podman" in args.sides:
                why = podman.available()
                if why:
                    skipped["podman"] = why
                else:
                    img = podman_image(Path(tmp), initrd_of(args.image_from), cid)
                    runners["podman"] = (podman_runner(img, groups["podman"], args.parallel), groups["podman"])
            if {"fork", "cold"} & set(args.sides):
                vms = Vms(args.image_from, args.memory_mib)
                if "fork" in args.sides:
                    tag = vms.parent(files, f"rollout-proj-{cid}")
                    runners["fork"] = (vms.fork_runner(tag, args.parallel), groups["vm"])
                if "cold" in args.sides:
                    runners["cold"] = (vms.cold_runner(files, args.parallel), groups["vm"])
            for n in args.n:
                for side in args.sides:
                    if side in runners:
                        log(f"{side}: {n} rollouts")
                        runs.append(measure(side, n, *runners[side]))
        finally:
            if vms is not None:
                vms.close()
            if groups["vm"] is not None:
                cpuacct.leave()
            for g in groups.values():
                if g is not None:
                    g.remove()
    return {"runs": runs, "ratios": ratios(runs), "skipped": skipped, "parallel": args.parallel,
            "memory_mib": args.memory_mib, "host_before": host_before, "host_after": host_facts(),
            "cpu_measured": all(g is not None for g in groups.values()), "wheels": list(project.WHEELS)}


def initrd_of(home: Path) -> Path:
    try:
        return home / "images" / (home / "images" / "default").read_text().strip() / "initrd.img"
    except OSError:
        raise RuntimeError(f"no guest image in {home} (run `forkd image build` there, or pass --image-from)") from None


def ratios(runs: list[dict]) -> list[dict]:
    out = []
    for n in sorted({r["n"] for r in runs}):
        by = {r["side"]: r for r in runs if r["n"] == n}
        for a, b in (("cold", "fork"), ("podman", "fork")):
            if a in by and b in by:
                out.append({"n": n, "of": f"{a}/{b}", "wall": ratio(by[a]["wall_s"], by[b]["wall_s"]),
                            "cpu": ratio(by[a]["cpu_s"], by[b]["cpu_s"])})
    return out


def side_tables(res: dict, each: str, prec: str = ".2f") -> list[str]:
    """The per-side table, the ratios, and what was skipped or failed: shared by the side-by-side benches."""
    lines = [f"| N | side | to all results s | host CPU s | per {each} p50 / p90 s | as expected |",
             "|---|---|---:|---:|---:|---:|"]
    for r in res["runs"]:
        e = r["each_s"]
        lines.append(f"| {r['n']} | {r['side']} | {fmt(r['wall_s'], prec)} | {fmt(r['cpu_s'], prec)} | "
                     f"{fmt(e['p50'])} / {fmt(e['p90'])} | {r['as_expected']}/{r['n']} |")
    lines += ["", "| N | ratio | time to all results | host CPU |", "|---|---|---:|---:|"]
    for q in res["ratios"]:
        lines.append(f"| {q['n']} | {q['of']} | {fmt(q['wall'], '.2f', 'x')} | {fmt(q['cpu'], '.2f', 'x')} |")
    for s, why in res["skipped"].items():
        lines.append(f"\n{s} not run: {why}")
    for r in res["runs"]:
        if r.get("error"):
            lines.append(f"\n{r['side']} x{r['n']} failed: {r['error'].splitlines()[0][:300]}")
    return lines


def table(res: dict) -> str:
    h = res["host_before"]
    lines = [f"Test rollouts, {res['parallel']} at once at most, {res['memory_mib']} MiB guests; {h['cpus']} CPUs, "
             f"load {h['load_1m']} -> {res['host_after']['load_1m']}, {h['qemu_processes']} QEMU processes of "
             "other sessions at the start", "",
             ] + side_tables(res, "rollout", ".1f")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="8", help="comma-separated rollout counts (8,32)")
    ap.add_argument("--sides", default=",".join(SIDES), help="comma-separated from: fork, cold, podman")
    ap.add_argument("--parallel", type=int, default=0, help="rollouts at once (default: all N)")
    ap.add_argument("--memory-mib", type=int, default=512)
    ap.add_argument("--image-from", type=Path, default=None, help="forkd home with the guest image ($FORKD_HOME)")
    ap.add_argument("--wheel-cache", type=Path, default=Path("/var/tmp/forkd-bench-wheels"))
    ap.add_argument("--report-dir", type=Path, default=None, help="write <date>-rollouts-n<N>.{json,md} here")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args()
    return run_sides(ap, args, SIDES, compare, table, "rollouts", "Test rollouts: fork vs cold boot vs podman")


def run_sides(ap: argparse.ArgumentParser, args: argparse.Namespace, sides, compare, table, name: str,
              title: str) -> int:
    """Parse --n and --sides, run `compare` with forkd's own cgroups out of the way, print (and report) its table;
    exits 1 unless every run gave the expected answers. Shared by the side-by-side benches."""
    args.n = [int(x) for x in args.n.split(",") if x.strip()]
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if bad := [s for s in args.sides if s not in sides]:
        ap.error(f"--sides: unknown {bad}; choose from {list(sides)}")
    args.parallel = args.parallel or max(args.n)
    empty = tempfile.mkdtemp(prefix="forkd-bench-no-cgroups-")
    cpuacct.no_forkd_cgroups(os.environ, empty)  # before forkd reads its settings
    if args.image_from is None:
        from forkd.base.settings import settings

        args.image_from = settings().home
    try:
        res = compare(args)
    finally:
        os.rmdir(empty)
    text = table(res)
    if args.report_dir:
        script = Path(sys.argv[0]).name
        j, m = write_report(args.report_dir, f"{name}-n{'-'.join(map(str, args.n))}", res,
                            f"# {title}\n\n`python3 bench/{script} {' '.join(sys.argv[1:])}`\n\n" + text)
        log(f"report: {j} and {m}")
    print(json.dumps(res, indent=2) if args.output == "json" else text)
    return 1 if any(r["as_expected"] != r["n"] for r in res["runs"]) else 0

if __name__ == "__main__":
    sys.exit(main())
