"""The forkd side of the side-by-side benchmarks: a private $FORKD_HOME with its own daemon (tests/chaos/rig.py,
the guest image copied from an existing home), a warm base snapshot, and a template: a child of the base that holds
the staged workload, checked by running the workload once, then branched (live) so samples fork from it."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.lib.cpuacct import CpuGroup
from bench.lib.project import ROOT, sample_argv

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.chaos.rig import Rig  # noqa: E402


def start(image_from: Path, cpu: CpuGroup | None, memory_mib: int, log) -> Rig:
    """A private home and its daemon (in `cpu`, so the VMMs it starts are counted there), with snapshot `base`."""
    rig = Rig.create(image_from=image_from, interval=1.0)
    rig.start_daemon()
    if cpu is not None:
        cpu.join(rig.daemon.pid)
    log(f"forkd: home {rig.home}; booting the base snapshot ({memory_mib} MiB)")
    res = rig.cli("snapshot", "create", "--tag", "base", "--memory-mib", str(memory_mib), "-o", "json",
                  timeout=1800)
    if res.returncode != 0:
        stop(rig)
        raise RuntimeError(f"forkd snapshot create failed: {res.stderr[-2000:]}")
    return rig


def template(rig: Rig, files: dict[str, bytes], tag: str, log) -> str:
    """Snapshot `tag`: a child of `base` with `files` under ROOT, the workload run once in it (a check), branched."""
    from forkd_client import Sandbox

    with Sandbox.create(template="base", socket=str(rig.home / "forkd.sock")) as sb:
        for rel, data in files.items():
            sb.files.write(f"{ROOT}/{rel}", data)
        res = sb.commands.run(sample_argv(ROOT, "/tmp/check"), timeout=1800)
        if "ok" not in res.stdout:
            raise RuntimeError(f"the workload failed in a forkd child: {res.stdout} {res.stderr[-1500:]}")
        sb.commands.run(["rm", "-rf", "/tmp/check"])
        sb.branch(tag, mode="live", wait=True)
    log(f"forkd: template {tag} ready")
    return tag


def stop(rig: Rig) -> list[int]:
    """Kill every child, stop the daemon, remove the home and the daemon's log; returns QEMU pids that had to be
    killed."""
    leaked = rig.destroy()
    rig.log_path.unlink(missing_ok=True)
    return leaked
