#!/usr/bin/env python3
"""Code-interpreter requests with numpy and pandas: forked from a warm parent vs cold boots vs podman, in one run.

    python3 bench/interpreter.py [--n 1,8] [--sides fork,cold,podman] [--memory-mib 1024]
                                 [--packages python3-numpy,python3-pandas] [--report-dir bench/reports] [-o json]

One request is what a code-interpreter session answers: a small numpy/pandas computation (a seeded random frame,
its column means and a norm) whose printed result every side must give as a container computed it beforehand. N
requests start at once; the figure is the time from the start to the last result, and the host CPU it took (each
side in a cgroup of its own weighted as N ordinary processes: bench/lib/cpuacct.py).

  fork    N children forked from a warm parent (numpy and pandas imported in its interpreter before the snapshot),
          each answering with the agent's warm interpreter (exec_code, as E2B's run_code);
  cold    N fresh VMs booted from the same image, each importing numpy and pandas and answering (python3 -c);
  podman  N containers (`podman run --rm`, runc, no network) of the same image's rootfs doing the same.

The image is a Debian guest image with the packages (forkd image build --debian-packages), built in a private
$FORKD_HOME (seeded from --image-from: the kernel and accelerator probe), removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.lib import cpuacct, podman  # noqa: E402
from bench.lib.reports import host_facts, ratio  # noqa: E402
from bench.rollouts import run_sides, side_tables, summarise, timed_all  # noqa: E402

SIDES = ("fork", "cold", "podman")
IMPORTS = ("numpy", "pandas")
REQUEST = ("rng = numpy.random.default_rng({i})\n"
           "df = pandas.DataFrame(rng.normal(size=(2000, 8)), columns=list('abcdefgh'))\n"
           "print('ok', round(float(df.mean().sum() + numpy.linalg.norm(df.values)), 6))")


def log(msg: str) -> None:
    print(f"[interpreter {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def request(i: int) -> str:
    return REQUEST.format(i=i)


def cold_argv(i: int) -> list[str]:
    return ["python3", "-c", "import numpy, pandas\n" + request(i)]


def expected(n: int, image: str | None) -> list[str]:
    """Each request's answer, computed natively by the same numpy and pandas: in a container of the image (run one
    at a time, before the measured runs); without podman, any 'ok ...' counts."""
    if image is None:
        return ["ok"] * n
    out = []
    for i in range(n):
        res = subprocess.run([*podman.run_argv(image, None, "--rm"), *cold_argv(i)], capture_output=True, text=True,
                             timeout=600)
        if not res.stdout.startswith("ok "):
            raise RuntimeError(f"request {i} failed in a container: {res.stdout} {res.stderr[-800:]}")
        out.append(res.stdout.strip())
    return out


def agrees(outs: list[str], want: list[str]) -> list[str]:
    """`outs` with each answer that matches its expectation (or is 'ok ...' when there is none) made equal to it."""
    return [w if (o == w or (w == "ok" and o.startswith("ok "))) else o for o, w in zip(outs, want, strict=True)]


class Vms:
    """A private home's runtime: the Debian image with the packages, its warm parent, forks and cold boots."""

    def __init__(self, image_from: Path, memory_mib: int, packages: list[str]):
        from forkd.base.paths import Layout
        from forkd.core.images import build_debian
        from forkd.core.runtime import Runtime
        from tests.chaos.rig import seed_home

        self.home = Path(tempfile.mkdtemp(prefix="fkinterp", dir="/tmp"))
        seed_home(self.home, image_from)
        for cached in ("debs", "debian"):  # the Debian packages already fetched: not downloaded again
            if (image_from / "cache" / cached).is_dir():
                shutil.copytree(image_from / "cache" / cached, self.home / "cache" / cached, dirs_exist_ok=True)
        self.rt = Runtime(Layout(self.home))
        self.memory_mib = memory_mib
        log(f"building the Debian image with {', '.join(packages)}")
        # an initramfs image: a cold VM then boots on no shared disk, and its rootfs is what the containers run
        self.image, _ = build_debian(self.rt, packages, memory_mib=memory_mib, progress=log, rootfs="initramfs")
        self.decision, _ = self.rt.accelerator(self.image, log)

    def parent(self, tag: str) -> str:
        from forkd.core.requests import ParentBuild

        log(f"booting and warming the parent ({self.memory_mib} MiB, imports {', '.join(IMPORTS)})")
        self.rt.create_snapshot(ParentBuild.of(tag=tag, memory_mib=self.memory_mib, warm_imports=IMPORTS,
                                               image_id=self.image.id, boot_timeout=900.0), progress=log)
        return tag

    def fork_runner(self, tag: str, parallel: int):
        from forkd.core.requests import Spawn

        def run(n: int):
            t0 = time.monotonic()
            kids = self.rt.fork(Spawn(tag=tag, n=n, timeout=1800))
            spawn = time.monotonic() - t0
            try:
                def one(i: int) -> str:
                    with self.rt.agent(kids[i].id, timeout=600) as a:
                        return a.exec_code(request(i), timeout=1800)["stdout"].strip()

                wall, each, outs = timed_all(n, one, parallel)
            finally:
                self.rt.kill([k.id for k in kids])
            return spawn + wall, [spawn + e for e in each], outs

        return run

    def cold_runner(self, parallel: int):
        from forkd.base.paths import tmpfs
        from forkd.vmm.driver import Machine, RunFiles

        machine = Machine(kernel=self.image.kernel, initrd=self.image.initrd, memory_mib=self.memory_mib,
                          accel=self.decision.accel)

        def one(i: int) -> str:
            work = self.rt.layout.tmp / f"cold-{os.getpid()}-{i}-{time.monotonic_ns()}"
            mem = (tmpfs() or work) / f"forkd-{work.name}.mem"
            vm = None
            try:
                work.mkdir(parents=True)
                vm = self.rt.driver.boot(machine, mem, RunFiles(work), timeout=1800)
                return vm.agent.exec(cold_argv(i), timeout=1800)["stdout"].strip()
            finally:
                if vm is not None:
                    self.rt.driver.stop(vm)
                mem.unlink(missing_ok=True)
                shutil.rmtree(work, ignore_errors=True)

        return lambda n: timed_all(n, one, parallel)

    def close(self) -> None:
        try:
            self.rt.kill(all_=True)
        finally:
            from forkd.base.paths import Layout

            shutil.rmtree(Layout(self.home).flat_cache.parent, ignore_errors=True)
            shutil.rmtree(self.home, ignore_errors=True)


def podman_image(image) -> str:
    """The image's rootfs (its initramfs) imported into podman."""
    with tempfile.TemporaryDirectory(prefix="forkd-bench-empty-") as empty:
        return podman.image_from_initrd(image.initrd, Path(empty), "/root", f"interp-{image.id}")


def podman_runner(image: str, group, parallel: int):
    def one(i: int) -> str:
        argv = [*podman.run_argv(image, group.rel if group else None, "--rm"), *cold_argv(i)]
        res = subprocess.run(group.wrap(argv) if group else argv, capture_output=True, text=True, timeout=3600)
        return res.stdout.strip() or f"exit {res.returncode}: {res.stderr[-300:]}"

    return lambda n: timed_all(n, one, parallel)


def measure(side: str, n: int, runner, group, want: list[str]) -> dict:
    cpu0 = group.usage_s() if group else None
    try:
        wall, each, outs = runner(n)
    except Exception as exc:  # noqa: BLE001 - reported in the result, the run goes on
        log(f"{side} x{n} failed: {str(exc).splitlines()[0][:300]}")
        return {"side": side, "n": n, "wall_s": None, "cpu_s": None, "as_expected": 0,
                "each_s": {"p50": None, "p90": None}, "error": str(exc)[:2000]}
    cpu = group.usage_s() - cpu0 if group else None
    return summarise(side, n, wall, each, agrees(outs, want), want, cpu)


def compare(args: argparse.Namespace) -> dict:
    groups = {s: cpuacct.CpuGroup.make(s, weight=args.parallel) for s in ("vm", "podman")}
    if groups["vm"] is not None:
        groups["vm"].join()
    skipped: dict[str, str] = {}
    runs: list[dict] = []
    host_before = host_facts()
    vms = Vms(args.image_from, args.memory_mib, args.packages)
    try:
        runners = {}
        why = podman.available()
        image = None if why else podman_image(vms.image)
        want = expected(max(args.n), image)
        if "podman" in args.sides:
            if why:
                skipped["podman"] = why
            else:
                runners["podman"] = (podman_runner(image, groups["podman"], args.parallel), groups["podman"])
        if "fork" in args.sides:
            runners["fork"] = (vms.fork_runner(vms.parent(f"interp-{vms.image.id}"), args.parallel), groups["vm"])
        if "cold" in args.sides:
            runners["cold"] = (vms.cold_runner(args.parallel), groups["vm"])
        for n in args.n:
            for side in args.sides:
                if side in runners:
                    log(f"{side}: {n} requests")
                    runs.append(measure(side, n, *runners[side], want[:n]))
    finally:
        vms.close()
        if groups["vm"] is not None:
            cpuacct.leave()
        for g in groups.values():
            if g is not None:
                g.remove()
    return {"runs": runs, "ratios": ratios(runs), "skipped": skipped, "parallel": args.parallel,
            "memory_mib": args.memory_mib, "packages": args.packages, "host_before": host_before,
            "host_after": host_facts(), "cpu_measured": all(g is not None for g in groups.values()),
            "request": request(0), "answers": want}


def ratios(runs: list[dict]) -> list[dict]:
    out = []
    for n in sorted({r["n"] for r in runs}):
        by = {r["side"]: r for r in runs if r["n"] == n}
        for a, b in (("cold", "fork"), ("podman", "fork")):
            if a in by and b in by:
                out.append({"n": n, "of": f"{a}/{b}", "wall": ratio(by[a]["wall_s"], by[b]["wall_s"]),
                            "cpu": ratio(by[a]["cpu_s"], by[b]["cpu_s"])})
    return out


def table(res: dict) -> str:
    h = res["host_before"]
    lines = [f"Code-interpreter requests ({', '.join(res['packages'])}), {res['parallel']} at once at most, "
             f"{res['memory_mib']} MiB guests; {h['cpus']} CPUs, load {h['load_1m']} -> "
             f"{res['host_after']['load_1m']}, {h['qemu_processes']} QEMU processes of other sessions at the start",
             "",
             ] + side_tables(res, "request")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,8", help="comma-separated request counts")
    ap.add_argument("--sides", default=",".join(SIDES), help="comma-separated from: fork, cold, podman")
    ap.add_argument("--parallel", type=int, default=0, help="requests at once (default: all N)")
    ap.add_argument("--memory-mib", type=int, default=1024)
    ap.add_argument("--packages", default="python3-numpy,python3-pandas", help="Debian packages of the image")
    ap.add_argument("--image-from", type=Path, default=None, help="forkd home with the guest image ($FORKD_HOME)")
    ap.add_argument("--report-dir", type=Path, default=None, help="write <date>-interpreter-n<N>.{json,md} here")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = ap.parse_args()
    args.packages = [p.strip() for p in args.packages.split(",") if p.strip()]
    return run_sides(ap, args, SIDES, compare, table, "interpreter",
                     "Code-interpreter requests: fork vs cold boot vs podman")

if __name__ == "__main__":
    sys.exit(main())
