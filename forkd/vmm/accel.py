"""Accelerator probe: decide KVM vs TCG by booting a real guest, not by looking at /dev/kvm.

On nested hosts /dev/kvm can exist while guests hang in it; only a guest that boots and prints the probe
marker within the time limit proves that KVM works.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from forkd.base import idrange
from forkd.vmm.driver import Decision
from forkd.vmm.qemu_cmdline import SANDBOX_RUNAS, UNSHARE

PROBE_MARKER = "FORKD-PROBE-OK"


def probe_argv(qemu: str, kernel: Path, initrd: Path, console: Path) -> list[str]:
    """The probe's QEMU: jailed like a build VMM (an empty network namespace of its own, a fresh uid from the VMM
    range once /dev/kvm and its files are open, QEMU's seccomp filter), since it boots the image's kernel."""
    n = idrange.build_uid(*idrange.vmm_range())
    return [UNSHARE, "--net", "--", qemu, "-M", "q35", "-accel", "kvm", "-m", "256M", "-smp", "1",
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", "console=ttyS0 quiet panic=-1 forkd.probe",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", f"file:{console}",
            "-runas", f"{n}:{n}", "-sandbox", SANDBOX_RUNAS]


def probe(qemu: str, kernel: Path, initrd: Path, timeout: float = 8.0) -> Decision:
    if not os.path.exists("/dev/kvm"):
        return Decision("tcg", "/dev/kvm does not exist", 0.0)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Decision("tcg", "/dev/kvm is not readable and writable by this user", 0.0)
    with tempfile.TemporaryDirectory(prefix="forkd-probe-") as d:
        console = Path(d) / "console.log"
        log = Path(d) / "qemu.log"
        argv = probe_argv(qemu, kernel, initrd, console)
        t0 = time.monotonic()
        with open(log, "wb") as lf:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        took = time.monotonic() - t0
        out = console.read_text(errors="replace") if console.exists() else ""
        if PROBE_MARKER in out:
            return Decision("kvm", f"a KVM guest booted and answered in {took:.1f}s", took)
        err = log.read_text(errors="replace").strip().splitlines()
        if proc.returncode not in (0, -9) and err:
            return Decision("tcg", f"QEMU could not start a KVM guest: {err[-1][:200]}", took)
        return Decision("tcg", f"a KVM guest did not answer within {timeout:.0f}s (nested or PVM host?); "
                               "using TCG software emulation", took)
