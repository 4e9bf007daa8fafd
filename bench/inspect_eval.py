#!/usr/bin/env python3
"""An Inspect eval of N samples with per-sample setup, on forkd vs Inspect's `local` provider vs podman containers.

    python3 bench/inspect_eval.py [--samples 16,64] [--providers local,podman,forkd] [--max-samples 8]
                                  [--image-from HOME] [--report-dir bench/reports] [-o json]

Each sample checks out a small pure-Python project, installs its dependency wheels (from the package index, fetched
once) and runs its test suite in its own sandbox; the scorer reads back the result file (bench/lib/project.py,
bench/lib/eval_task.py; Inspect's mock model, never called). The same eval runs on each provider, one after the
other in one invocation, each in its own Inspect process:

  local   Inspect's `local` provider: no isolation, a temp directory per sample on the host (the lower bound);
  podman  a container per sample (`podman run -d`, `podman exec`, `podman rm`: bench/lib/inspect_podman.py, since
          Inspect's docker provider needs docker compose) of an image holding the forkd guest's own rootfs plus the
          project, under runc;
  forkd   the `forkd` provider: a child per sample forked from a template (a child of a warm base snapshot that holds
          the project, branched once before the eval) through a private daemon.

Per provider: the eval's wall time, the host CPU of everything it ran (Inspect's process, and the daemon and VMMs,
or podman, conmon and the containers: one cpuacct group each, bench/lib/cpuacct.py), per-sample times p50/p90
(Inspect's total time per sample, and the setup-and-test command alone), and ratios to `local` and forkd/podman.
Each provider runs in a cgroup of its own weighted as --max-samples ordinary processes, forkd's children included
(they run unconstrained, out of forkd's own cgroups), so each gets the same share of a shared host
(bench/lib/cpuacct.py says why).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.lib import cpuacct, podman, project  # noqa: E402
from bench.lib.reports import fmt, host_facts, percentile, ratio, write_report  # noqa: E402

PROVIDERS = ("local", "podman", "forkd")


def log(msg: str) -> None:
    print(f"[inspect-eval {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- one provider's eval, in its own process --------------------------------------------------------------

def run_variant(args: argparse.Namespace) -> int:
    """The child process: join the provider's cpuacct group, run the eval, print one JSON line of what it saw."""
    cpuacct.join_env(os.environ)
    from inspect_ai import eval as inspect_eval
    from inspect_ai.util import SandboxEnvironmentSpec

    from bench.lib.eval_task import eval_task

    if args.run_variant == "podman":
        import bench.lib.inspect_podman  # noqa: F401 - registers sandbox="bench-podman"
        spec: object = "bench-podman"
    elif args.run_variant == "forkd":
        from forkd_client.inspect_config import ForkdSandboxConfig

        spec = SandboxEnvironmentSpec("forkd", ForkdSandboxConfig(template=args.template))
    else:
        spec = "local"
    task = eval_task(args.n, args.root, spec)
    cpu0, t0 = cpuacct.usage_of_env(os.environ), time.monotonic()
    [res] = inspect_eval(task, model="mockllm/model", log_dir=args.log_dir, log_format="json", display="none",
                         max_samples=args.max_samples, max_sandboxes=args.max_samples, fail_on_error=False)
    wall, cpu1 = time.monotonic() - t0, cpuacct.usage_of_env(os.environ)
    print(json.dumps({"wall_s": wall, "cpu_s": None if cpu0 is None else cpu1 - cpu0, "status": res.status,
                      "log": res.location}))
    return 0


def sample_times(log_path: str) -> dict:
    """Per-sample figures from the eval's JSON log: Inspect's total time per sample, the setup-and-test command's
    own, and the rest (the sandbox's start, the scorer's file read, the clean-up: what the provider adds)."""
    data = json.loads(Path(log_path).read_text())
    samples = data.get("samples") or []
    scores = [(s.get("scores") or {}).get("tests_passed") or {} for s in samples]
    total = [s.get("total_time") for s in samples]
    execs = [(sc.get("metadata") or {}).get("exec_s") for sc in scores]
    rest = [t - e for t, e in zip(total, execs, strict=True) if t is not None and e is not None]
    total, execs = [t for t in total if t is not None], [e for e in execs if e is not None]
    return {"samples": len(samples), "correct": sum(1 for sc in scores if sc.get("value") == "C"),
            "sample_total_s": {"p50": percentile(total, 50), "p90": percentile(total, 90)},
            "setup_and_test_s": {"p50": percentile(execs, 50), "p90": percentile(execs, 90)},
            "sandbox_overhead_s": {"p50": percentile(rest, 50), "p90": percentile(rest, 90)},
            "errors": [str(s.get("error"))[:300] for s in samples if s.get("error")][:3]}


def eval_once(provider: str, n: int, args: argparse.Namespace, env: dict[str, str], group) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"forkd-bench-{provider}-") as logs:
        argv = [sys.executable, str(BENCH / "inspect_eval.py"), "--run-variant", provider, "--n", str(n),
                "--root", env["BENCH_ROOT"], "--template", env.get("BENCH_TEMPLATE", ""), "--log-dir", logs,
                "--max-samples", str(args.max_samples)]
        child_env = dict(env, BENCH_CPUACCT=group.rel if group else "")
        log(f"{provider}: eval of {n} samples")
        t0 = time.monotonic()
        res = subprocess.run(argv, capture_output=True, text=True, env=child_env, timeout=args.timeout)
        outer = time.monotonic() - t0
        if res.returncode != 0:
            raise RuntimeError(f"the {provider} eval exited {res.returncode}: {res.stderr[-3000:]}")
        out = json.loads(res.stdout.strip().splitlines()[-1])
        out.update(sample_times(out.pop("log").removeprefix("file://")), provider=provider, n=n,
                   process_wall_s=outer)
    log(f"{provider}: {out['wall_s']:.1f} s wall, CPU {out['cpu_s'] or 0:.1f} s, "
        f"{out['correct']}/{out['samples']} scored correct")
    return out


# -- the comparison ---------------------------------------------------------------------------------------

def prepare(args: argparse.Namespace, staged: Path, groups: dict, skipped: dict) -> tuple[dict[str, str], object]:
    """Stage the workload and give each provider what it needs; returns the child env and the forkd rig."""
    files = project.stage(staged, args.wheel_cache)
    cid = project.content_id(files)
    env = dict(os.environ, BENCH_ROOT=project.ROOT, PYTHONPATH=str(BENCH.parent))
    rig = None
    if "podman" in args.providers:
        why = podman.available()
        if why:
            skipped["podman"] = why
        else:
            initrd = _initrd(args.image_from)
            env["BENCH_PODMAN_IMAGE"] = podman.image_from_initrd(initrd, staged, project.ROOT, cid)
            env["BENCH_PODMAN_CGROUP"] = groups["podman"].rel if groups.get("podman") else ""
    if "forkd" in args.providers:
        from bench.lib import forkd_side

        cpuacct.no_forkd_cgroups(os.environ, str(staged / "no-cgroups"))  # the daemon's env comes from ours
        (staged / "no-cgroups").mkdir()
        rig = forkd_side.start(args.image_from, groups.get("forkd"), args.memory_mib, log)
        env["BENCH_TEMPLATE"] = forkd_side.template(rig, files, f"bench-eval-{cid}", log)
        env.update(FORKD_HOME=str(rig.home))
        env.pop("FORKD_URL", None)
    return env, rig


def _initrd(home: Path) -> Path:
    """The default guest image's initramfs in `home` (what forkd children run, and what the containers get)."""
    images = home / "images"
    try:
        image_id = (images / "default").read_text().strip()
    except OSError:
        raise RuntimeError(f"no guest image in {home} (run `forkd image build` there, or pass --image-from)") from None
    return images / image_id / "initrd.img"


def compare(args: argparse.Namespace) -> dict:
    groups = {p: cpuacct.CpuGroup.make(p, weight=args.max_samples) for p in args.providers}
    skipped: dict[str, str] = {}
    rig = None
    host_before = host_facts()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="forkd-bench-stage-") as tmp:
        staged = Path(tmp)
        try:
            env, rig = prepare(args, staged, groups, skipped)
            env_local = dict(env, BENCH_ROOT=str(staged))  # local runs on the host: the staged directory is here
            for n in args.samples:
                for p in args.providers:
                    if p not in skipped:
                        runs.append(eval_once(p, n, args, env_local if p == "local" else env, groups[p]))
        finally:
            leaked = [] if rig is None else _stop_forkd(rig)
            for g in groups.values():
                if g is not None:
                    g.remove()
    return {"runs": runs, "ratios": ratios(runs), "skipped": skipped, "max_samples": args.max_samples,
            "host_before": host_before, "host_after": host_facts(), "leaked_qemu": leaked,
            "cpu_measured": all(g is not None for g in groups.values()), "wheels": list(project.WHEELS)}


def _stop_forkd(rig) -> list[int]:
    from bench.lib import forkd_side

    return forkd_side.stop(rig)


def ratios(runs: list[dict]) -> list[dict]:
    """Per N: each provider's wall and CPU over local's, and forkd over podman."""
    out = []
    for n in sorted({r["n"] for r in runs}):
        by = {r["provider"]: r for r in runs if r["n"] == n}
        for a, b in (("forkd", "local"), ("podman", "local"), ("forkd", "podman")):
            if a in by and b in by:
                out.append({"n": n, "of": f"{a}/{b}", "wall": ratio(by[a]["wall_s"], by[b]["wall_s"]),
                            "cpu": ratio(by[a]["cpu_s"], by[b]["cpu_s"]),
                            "sample_p50": ratio(by[a]["sample_total_s"]["p50"], by[b]["sample_total_s"]["p50"]),
                            "overhead_p50": ratio(by[a]["sandbox_overhead_s"]["p50"],
                                                  by[b]["sandbox_overhead_s"]["p50"])})
    return out


def table(res: dict) -> str:
    h = res["host_before"]
    lines = [f"Inspect eval, per-sample setup (checkout + {len(res['wheels'])} wheels + tests), "
             f"max {res['max_samples']} samples at once; {h['cpus']} CPUs, load {h['load_1m']} -> "
             f"{res['host_after']['load_1m']}, {h['qemu_processes']} QEMU processes of other sessions at the start",
             "",
             "| N | provider | wall s | host CPU s | sample p50 / p90 s | setup+tests p50 / p90 s | "
             "sandbox start+clean-up p50 / p90 s | correct |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        st, ex, ov = r["sample_total_s"], r["setup_and_test_s"], r["sandbox_overhead_s"]
        lines.append(f"| {r['n']} | {r['provider']} | {fmt(r['wall_s'], '.1f')} | {fmt(r['cpu_s'], '.1f')} | "
                     f"{fmt(st['p50'])} / {fmt(st['p90'])} | {fmt(ex['p50'])} / {fmt(ex['p90'])} | "
                     f"{fmt(ov['p50'])} / {fmt(ov['p90'])} | {r['correct']}/{r['samples']} |")
    lines += ["", "| N | ratio | wall | host CPU | sample p50 | sandbox start+clean-up p50 |",
              "|---|---|---:|---:|---:|---:|"]
    for q in res["ratios"]:
        lines.append(f"| {q['n']} | {q['of']} | {fmt(q['wall'], '.2f', 'x')} | {fmt(q['cpu'], '.2f', 'x')} | "
                     f"{fmt(q['sample_p50'], '.2f', 'x')} | {fmt(q['overhead_p50'], '.2f', 'x')} |")
    for p, why in res["skipped"].items():
        lines.append(f"\n{p} not run: {why}")
    if not res["cpu_measured"]:
        lines.append("\nhost CPU not measured: no cgroup v1 cpuacct hierarchy to count it in")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", default="16", help="comma-separated sample counts, each a separate eval (16,64)")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated from: local, podman, forkd")
    ap.add_argument("--max-samples", type=int, default=8, help="samples (and sandboxes) at once, every provider")
    ap.add_argument("--memory-mib", type=int, default=512, help="guest RAM of forkd's base snapshot")
    ap.add_argument("--image-from", type=Path, default=None,
                    help="the forkd home whose guest image to use (default: $FORKD_HOME's)")
    ap.add_argument("--wheel-cache", type=Path, default=Path("/var/tmp/forkd-bench-wheels"))
    ap.add_argument("--report-dir", type=Path, default=None, help="write <date>-inspect-eval-n<N>.{json,md} here")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds one provider's eval may take")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    for hidden in ("--run-variant", "--root", "--template", "--log-dir"):
        ap.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_variant:
        return run_variant(args)
    args.samples = [int(x) for x in args.samples.split(",") if x.strip()]
    args.providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if bad := [p for p in args.providers if p not in PROVIDERS]:
        ap.error(f"--providers: unknown {bad}; choose from {list(PROVIDERS)}")
    if args.image_from is None:
        from forkd.base.settings import settings

        args.image_from = settings().home
    res = compare(args)
    text = table(res)
    if args.report_dir:
        name = f"inspect-eval-n{'-'.join(map(str, args.samples))}"
        j, m = write_report(args.report_dir, name, res, "# Inspect eval: forkd vs local vs podman\n\n"
                            f"`python3 bench/inspect_eval.py {' '.join(sys.argv[1:])}`\n\n" + text)
        log(f"report: {j} and {m}")
    print(json.dumps(res, indent=2) if args.output == "json" else text)
    failed = [r for r in res["runs"] if r["correct"] != r["samples"] or r["samples"] != r["n"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
