#!/usr/bin/env python3
"""Image benchmark, against real VMs:

    python3 bench/images.py [--home DIR] [--runs 10] [--memory-mib 1024] [--suite bookworm] [--cold] [-o json]

1. Image build time for the Debian numpy image (python3 + python3-numpy via mmdebstrap): cold (no cached
   image; with --cold the downloaded .debs are dropped too) vs cached (content hash hit, nothing built).
2. A parent from that image with `numpy` imported in the agent, snapshotted; in one warm child:
   `eval("numpy.arange(1000).sum()")` answered by the warm interpreter vs
   `python3 -c 'import numpy; print(numpy.arange(1000).sum())'` exec'd in the same child (a cold interpreter
   that imports numpy first). Upstream: 1 ms vs 96 ms. Reports p50/p90 of each over --runs.
3. The same package set built disk-backed (`rootfs=disk`: an ext4 root disk, a qcow2 overlay per child) next to
   the initramfs image, side by side in one run: build time, fork -> first numpy eval (p50/p90 and the ratio),
   writing 64 MiB with fsync inside a child, and a live branch's pause of a child of each (for the disk-backed
   one also how long its filesystem stayed frozen).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forkd.base.errors import ForkdError  # noqa: E402
from forkd.base.paths import Layout  # noqa: E402
from forkd.base.settings import settings  # noqa: E402
from forkd.core import images as core_images  # noqa: E402
from forkd.core.requests import Branch, ParentBuild, Spawn
from forkd.core.runtime import Runtime  # noqa: E402

EXPR = "numpy.arange(1000).sum()"
TAG = "bench-numpy"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, -(-9 * len(s) // 10) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=str(settings().home))
    ap.add_argument("--runs", type=int, default=10, help="evals / execs to time")
    ap.add_argument("--memory-mib", type=int, default=1024)
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--cold", action="store_true", help="also drop the cached .debs before the cold build")
    ap.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = ap.parse_args()

    rt = Runtime(Layout(Path(args.home)))
    result: dict = {"packages": ["python3-numpy"], "suite": args.suite}
    try:
        # -- build: cold, then cached
        if args.cold:
            shutil.rmtree(rt.layout.cache / "debian" / args.suite, ignore_errors=True)
        t0 = time.perf_counter()  # cold: force a full build (replaces the cached image atomically)
        image, built = core_images.build_debian(rt, ["python3-numpy"], args.suite, progress=log, force=True)
        result["build_cold_s"] = round(time.perf_counter() - t0, 2)
        result["debs_cached_during_cold_build"] = not args.cold
        t0 = time.perf_counter()
        _, built_again = core_images.build_debian(rt, ["python3-numpy"], args.suite)
        result["build_cached_s"] = round(time.perf_counter() - t0, 3)
        assert built and not built_again
        result["image"] = {"id": image.id, "rootfs_mib": round(image.meta["rootfs_bytes"] / 2**20, 1),
                           "initrd_mib": round(image.meta["initrd_bytes"] / 2**20, 1)}
        log(f"build cold {result['build_cold_s']} s, cached {result['build_cached_s']} s")

        # -- warm eval vs cold import in the same child
        try:
            rt.rmi(TAG, force=True)
        except ForkdError:
            pass
        t0 = time.perf_counter()
        rt.create_snapshot(ParentBuild.of(tag=TAG, memory_mib=args.memory_mib, warm_imports=("numpy",),
                                            image_id=image.id), progress=log)
        result["parent_s"] = round(time.perf_counter() - t0, 2)
        (child,) = rt.fork(Spawn.of(tag=TAG, n=1))
        try:
            evals, execs = [], []
            with rt.agent(child.id) as a:
                a.eval(EXPR)  # first eval: TCG translates the path once
                a.exec(["python3", "-c", "import numpy"])
                a.eval(EXPR)  # the exec's fresh interpreter evicted the agent's code from TCG's translation cache
                for _ in range(args.runs):
                    t = time.perf_counter()
                    r = a.eval(EXPR)
                    evals.append((time.perf_counter() - t) * 1000.0)
                    assert r["value"] == "499500" or r["value"].endswith("(499500)"), r
                for _ in range(args.runs):
                    t = time.perf_counter()
                    r = a.exec(["python3", "-c", f"import numpy; print({EXPR})"])
                    execs.append((time.perf_counter() - t) * 1000.0)
                    assert r["stdout"].strip() == "499500", r
        finally:
            rt.kill([child.id])
        result["warm_eval_ms"] = {"p50": round(statistics.median(evals), 2), "p90": round(p90(evals), 2)}
        result["cold_import_exec_ms"] = {"p50": round(statistics.median(execs), 1), "p90": round(p90(execs), 1)}
        result["speedup_p50"] = round(statistics.median(execs) / statistics.median(evals), 1)
        result["disk_vs_initramfs"] = disk_vs_initramfs(rt, args)
    except ForkdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for tag in (TAG, TAG + "-disk", "bench-br-initramfs", "bench-br-disk"):
            try:
                rt.rmi(tag, force=True)
            except ForkdError:
                pass
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"image build (python3-numpy, {args.suite}): cold {result['build_cold_s']} s "
              f"({'debs cached' if not args.cold else 'debs downloaded'}), cached {result['build_cached_s']} s; "
              f"rootfs {result['image']['rootfs_mib']} MiB")
        print(f"eval({EXPR!r}) in a warm child: p50 {result['warm_eval_ms']['p50']} ms, "
              f"p90 {result['warm_eval_ms']['p90']} ms")
        print(f"python3 -c 'import numpy; ...' in the same child: p50 {result['cold_import_exec_ms']['p50']} ms, "
              f"p90 {result['cold_import_exec_ms']['p90']} ms  ({result['speedup_p50']}x)")
        d = result["disk_vs_initramfs"]
        print(f"disk-backed image (same packages): build {d['build_disk_s']} s; parent boot+warm "
              f"{d['parent_s']['disk']} s vs {d['parent_s']['initramfs']} s (initramfs)")
        for k, label in (("spawn_ms", "fork -> first numpy eval"), ("write_64mib_fsync_ms", "64 MiB write+fsync"),
                         ("live_branch_pause_ms", "live branch pause")):
            v = d[k]
            print(f"{label}: disk p50 {v['disk']['p50']} ms / p90 {v['disk']['p90']} ms vs initramfs "
                  f"p50 {v['initramfs']['p50']} ms / p90 {v['initramfs']['p90']} ms  (disk/initramfs "
                  f"{v['ratio_p50']}x)")
        print(f"per-child overlay after the 64 MiB write: {d['overlay_mib_after_write']} MiB")
        if d["live_branch_fs_frozen_ms"]:
            print(f"live branch of a disk-backed child: its filesystem frozen (writers waiting, vCPUs running) p50 "
                  f"{d['live_branch_fs_frozen_ms']['p50']} ms / p90 {d['live_branch_fs_frozen_ms']['p90']} ms")
    return 0


def _stats(xs: list[float]) -> dict:
    return {"p50": round(statistics.median(xs), 1), "p90": round(p90(xs), 1)}


def disk_vs_initramfs(rt: Runtime, args) -> dict:
    """Section 3: the numpy image disk-backed vs as an initramfs, measured alternately in one run."""
    from forkd.core.branch import branch

    out: dict = {}
    t0 = time.perf_counter()
    disk_image, _ = core_images.build_debian(rt, ["python3-numpy"], args.suite, progress=log, force=True,
                                             rootfs="disk")
    out["build_disk_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    rt.create_snapshot(ParentBuild.of(tag=TAG + "-disk", memory_mib=args.memory_mib, warm_imports=("numpy",),
                                       image_id=disk_image.id), progress=log)
    out["parent_s"] = {"disk": round(time.perf_counter() - t0, 2),
                       "initramfs": round(rt.store.get(TAG).timings_ms.get("boot", 0) / 1000
                                          + rt.store.get(TAG).timings_ms.get("warmup", 0) / 1000, 2)}
    tags = {"initramfs": TAG, "disk": TAG + "-disk"}
    spawn: dict[str, list[float]] = {k: [] for k in tags}
    write: dict[str, list[float]] = {k: [] for k in tags}
    pause: dict[str, list[float]] = {k: [] for k in tags}
    frozen: list[float] = []
    overlay = 0.0
    for i in range(args.runs):
        for kind, tag in tags.items():
            t = time.perf_counter()
            (c,) = rt.fork(Spawn.of(tag=tag, n=1))
            r = rt.eval(c.id, EXPR)
            spawn[kind].append((time.perf_counter() - t) * 1000.0)
            assert r["value"].endswith("499500") or r["value"].endswith("(499500)"), r
            try:
                t = time.perf_counter()
                r = rt.exec(c.id, ["sh", "-c", "dd if=/dev/urandom of=/root/w.bin bs=1M count=64 conv=fsync "
                                                "2>/dev/null"])
                write[kind].append((time.perf_counter() - t) * 1000.0)
                assert r["exit_code"] == 0, r
                if kind == "disk":
                    overlay = (Path(c.dir) / "disk.qcow2").stat().st_blocks * 512 / 2**20
                if i < 3:  # a live branch of each: the pause the child saw
                    br = f"bench-br-{kind}"
                    res = branch(rt, Branch.of(child_id=c.id, tag=br, mode="live"))
                    pause[kind].append(float(res.timings_ms.get("pause", -1)))
                    if "fs_frozen" in res.timings_ms:
                        frozen.append(res.timings_ms["fs_frozen"])
                    rt.rmi(br, force=True)
            finally:
                rt.kill([c.id])
    for name, data in (("spawn_ms", spawn), ("write_64mib_fsync_ms", write), ("live_branch_pause_ms", pause)):
        out[name] = {k: _stats(v) for k, v in data.items()}
        out[name]["ratio_p50"] = round(out[name]["disk"]["p50"] / out[name]["initramfs"]["p50"], 2)
    out["overlay_mib_after_write"] = round(overlay, 1)
    out["live_branch_fs_frozen_ms"] = _stats(frozen) if frozen else None  # disk: how long guest writers waited
    return out


if __name__ == "__main__":
    sys.exit(main())
