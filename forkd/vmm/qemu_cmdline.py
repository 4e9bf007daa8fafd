"""The QEMU command line and the VMM's identity: `qemu_argv` (devices, memory backend, console ring, tap NIC,
seccomp sandbox, network namespace), the guest kernel command line, the VMM's environment, the uid:gid a VMM
drops to (`build_identity`, `may_drop`) and why an unprivileged VMM cannot live-capture, and the boot-header stub
of the kernel that restored VMMs load instead of the whole kernel. `QemuDriver` (forkd.vmm.qemu) runs them."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from forkd.base import idrange
from forkd.base.errors import ForkdError
from forkd.base.settings import settings
from forkd.vmm.disk_fds import TOP as disk_fds_top
from forkd.vmm.disk_fds import DiskFds
from forkd.vmm.driver import AGENT_PORT, TAP_NAME, Machine, RunFiles

SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
SANDBOX_RUNAS = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"
GUEST_MAC = "52:54:00:12:34:56"
# The guest's serial console goes to a ring inside QEMU (oldest bytes dropped), never to a file QEMU writes: a guest
# could fill the disk. The driver copies the ring out (bounded) into RunFiles.console when it reports a failure.
CONSOLE_RING = 256 << 10  # bytes (a power of two, as QEMU requires)
CONSOLE_DEV = "console"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"


def qemu_argv(binary: str, machine: Machine, mem_path: Path, files: RunFiles, *, share: bool,
              incoming: bool, sandbox: bool, extra_cmdline: str = "", netns: str | None = None,
              runas: str | None = None, disk: Path | None = None, private_net: bool = False,
              disk_fds: DiskFds | None = None) -> list[str]:
    """The QEMU command line. `machine.network` != "none" adds one virtio-net NIC on a tap named TAP_NAME with the
    fixed GUEST_MAC (parent and children must have the same device set and the guest keeps its MAC). The tap
    lives in a network namespace: `netns` (prepared by the caller: forkd.sandbox.netns) or, without one, a fresh
    empty namespace of QEMU's own (`unshare --net`: the NIC exists but has no peer; used for parents and layer
    builds). `private_net` puts a VMM without a NIC in an empty namespace too (build VMMs: they run image and layer
    code, so a compromised one must not reach the host's loopback services; children skip it, ~25 ms each).
    `runas` ("uid:gid") makes QEMU drop to that identity once its files, sockets and tap are open.
    `disk` (a qcow2 file) is the root disk of a disk-backed image: one virtio-blk device, after the NIC, so
    parents and children have the same devices at the same PCI addresses. Children's overlays are throw-away,
    so their host flushes are skipped (cache=unsafe). `disk_fds`: the chain opened by the driver (a VMM that
    drops root opens no image by path: forkd.vmm.disk_fds)."""
    accel = f"tcg,tb-size={settings().tcg_tb_mib}" if machine.accel == "tcg" else machine.accel
    mem = f"{machine.memory_mib}M"
    argv = [
        binary, "-name", f"forkd,process=forkd-{files.dir.name}",
        "-M", "q35,memory-backend=ram", "-accel", accel, "-m", mem, "-smp", str(machine.vcpus),
        "-object", f"memory-backend-file,id=ram,size={mem},mem-path={mem_path},share={'on' if share else 'off'},"
                   f"merge={'on' if settings().vmm_ksm else 'off'}",  # forkd.vmm.ksm
        "-kernel", str(machine.kernel), "-initrd", str(machine.initrd),
        "-append", (guest_cmdline(machine) + " " + extra_cmdline).strip(),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-chardev", f"ringbuf,id={CONSOLE_DEV},size={CONSOLE_RING}", "-serial", f"chardev:{CONSOLE_DEV}",
        "-qmp", f"unix:{files.qmp},server=on,wait=off",
        "-device", "virtio-serial-pci,id=vs0",
        "-chardev", f"socket,id=agent,path={files.agent},server=on,wait=off",
        "-device", f"virtserialport,bus=vs0.0,chardev=agent,name={AGENT_PORT}",
    ]
    if machine.network != "none":
        argv += ["-netdev", f"tap,id=net0,ifname={TAP_NAME},script=no,downscript=no",
                 "-device", f"virtio-net-pci,netdev=net0,mac={GUEST_MAC}"]
    if disk is not None and disk_fds is not None:
        argv += [*disk_fds.argv, "-device", f"virtio-blk-pci,drive={disk_fds_top}"]
    elif disk is not None:
        cache = "unsafe" if incoming else "writeback"
        argv += ["-drive", f"file={disk},if=none,id=root,format=qcow2,cache={cache},discard=unmap",
                 "-device", "virtio-blk-pci,drive=root"]
    if incoming:
        argv += ["-incoming", "defer"]
    else:  # a booting guest that powers off or panics pauses (its console ring stays readable) until boot() is done
        argv += ["-no-shutdown"]
    if runas and (disk is None or disk_fds is not None) and settings().vmm_jail:
        argv += ["-chroot", str(empty_root())]
    if runas:
        # -runas calls setgid/setuid after init, which elevateprivileges=deny (and =children) kill with SIGSYS
        # (measured, QEMU 7.2). Once QEMU runs as a uid without capabilities, set*id cannot raise it again.
        argv += ["-runas", runas]
    if sandbox:
        argv += ["-sandbox", SANDBOX_RUNAS if runas else SANDBOX]
    if not netns and (machine.network != "none" or private_net):  # unshare execs QEMU in place: its pid
        argv = [UNSHARE, "--net", "--", *argv]  # (a named `netns` is entered by the driver: netns_path)
    return argv


def netns_path(netns: str) -> str:
    """Where a named network namespace the caller prepared is (the driver starts QEMU inside it)."""
    return f"/run/netns/{netns}"


def empty_root() -> Path:
    """The directory a dropped VMM is chrooted into once its files are open (QEMU's -chroot, with -runas): empty,
    root's, not writable by anyone else, so a compromised VMM sees no host file by path. Made on first use in
    FORKD_RUN_DIR; refused (never used) when it is anything else."""
    d = settings().run_dir / "vmm-root"
    d.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o555)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o222 or os.listdir(d):
        raise ForkdError(f"{d} must be an empty directory of root's that nobody may write (a VMM's whole view of "
                         "the host's files once it has dropped root)", hint=f"remove {d}: forkd makes it again")
    return d


def guest_cmdline(machine: Machine) -> str:
    """The kernel command line a parent boots with: the machine's own when a caller set one, else
    FORKD_GUEST_CMDLINE (whose default turns off the guest's idle wake-ups: the soft-lockup watchdog, and the
    clocksource watchdog that reads the emulated HPET; measured by bench/density.py --compare)."""
    return machine.cmdline if machine.cmdline != Machine.cmdline else settings().guest_cmdline


def vmm_env() -> dict[str, str]:
    """The environment of a VMM process: ours, plus MALLOC_ARENA_MAX when FORKD_VMM_MALLOC_ARENA_MAX is set."""
    env = dict(os.environ)
    arenas = settings().vmm_malloc_arena_max
    if arenas:
        env["MALLOC_ARENA_MAX"] = str(arenas)
    return env


UNPRIVILEGED_UFFD = Path("/proc/sys/vm/unprivileged_userfaultfd")
UFFD_HINT = ("QEMU 7.2's background snapshot opens a userfaultfd that handles kernel faults, which Linux allows a "
             "process without CAP_SYS_PTRACE only with vm.unprivileged_userfaultfd=1: run scripts/setup.sh (or "
             "`sysctl -w vm.unprivileged_userfaultfd=1`), or branch with --mode full, or keep VMMs as root "
             "(FORKD_VMM_RUNAS=root, see SECURITY.md)")


def may_drop(machine: Machine) -> bool:
    """Whether a VMM for `machine` drops root: under FORKD_VMM_RUNAS=per-child, every VMM (a disk-backed one gets
    its chain as descriptors, forkd.vmm.disk_fds, since QEMU reopens its images when a migration hands the block
    devices over)."""
    return settings().vmm_runas_per_child


def build_identity(machine: Machine) -> str | None:
    """The uid:gid a VMM nobody names an identity for (parent boots, layer builds, branch conversions: they run
    image and layer code too) drops to: a fresh random one per VMM when `may_drop`, else None (QEMU stays root).
    Nothing needs to find it again: the VMM lives one build."""
    if not may_drop(machine):
        return None
    n = idrange.build_uid(*idrange.vmm_range())
    return f"{n}:{n}"


def vmm_uid(pid: int) -> int | None:
    """The real uid of process `pid` (its /proc status), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def unprivileged_uffd_problem(pid: int | None) -> tuple[str, str] | None:
    """Why the unprivileged VMM `pid` cannot open the userfaultfd a live capture needs, or None."""
    uid = vmm_uid(pid) if pid else None
    if not uid:  # root (CAP_SYS_PTRACE) or gone: nothing to say here
        return None
    try:
        allowed = UNPRIVILEGED_UFFD.read_text().strip() == "1"
    except OSError:  # kernels before 5.2 have no sysctl: userfaultfd is open to every user
        allowed = True
    if allowed:
        return None
    return f"its VMM runs as uid {uid} and vm.unprivileged_userfaultfd is 0", UFFD_HINT


def kernel_stub(kernel: Path, dest: Path) -> Path:
    """The real-mode setup part of a bzImage: enough for QEMU to set up the same boot ROM, 30 KB not 14 MB."""
    with open(kernel, "rb") as f:
        head = f.read(0x1000)
        if head[0x202:0x206] != b"HdrS":
            return kernel  # not a bzImage: use it whole
        setup_sects = head[0x1F1] or 4
        f.seek(0)
        data = f.read((setup_sects + 1) * 512 + 4096)
    dest.write_bytes(data)
    return dest
