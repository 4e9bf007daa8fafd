"""forkd doctor's security posture (checks named `security:...`): VMM uid, seccomp, daemon socket, store
permissions, egress, protected links, unprivileged userfaultfd, page merging, swap. Each is PASS or WARN with
the fix."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base.errors import ForkdError
from forkd.base.procs import is_alive, run
from forkd.base.settings import settings
from forkd.core.doctor import PASS, UNPRIVILEGED_UFFD_SYSCTL, WARN, Check, _line, _sysctl
from forkd.core.idle import ZRAM_FIX
from forkd.sandbox import firewall
from forkd.vmm.pageout import not_in_ram, swap_devices

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime


SEC = "security:"
PROTECTED_LINKS = (Path("/proc/sys/fs/protected_symlinks"), Path("/proc/sys/fs/protected_hardlinks"))
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
SYSCTL_FIX = "scripts/setup.sh sets it (/etc/sysctl.d/60-forkd.conf), or: sysctl -w {}"


def _proc_status(pid: int) -> dict[str, str]:
    """The fields of /proc/<pid>/status ({} once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def _running_vmms(rt: Runtime) -> list[tuple[str, dict[str, str]]]:
    """(child id, /proc status) of every recorded child whose VMM is alive."""
    out = []
    for rec in rt.registry.list():
        if rec.pid and is_alive(rec.pid, rec.started):
            status = _proc_status(rec.pid)
            if status:
                out.append((rec.id, status))
    return out


def check_vmm_uid(rt: Runtime) -> Check:
    """VMMs drop root (FORKD_VMM_RUNAS) and the running ones did: no uid 0, no effective capability."""
    mode = settings().vmm_runas
    vmms = _running_vmms(rt)
    priv = [cid for cid, st in vmms if st.get("Uid", "0").split()[0] == "0" or int(st.get("CapEff", "0"), 16)]
    found = f"FORKD_VMM_RUNAS={mode}; {len(vmms)} running VMMs, {len(priv)} with uid 0 or capabilities"
    if mode != "per-child":
        return Check(SEC + "vmm-uid", WARN, f"{found}: a QEMU bug is host root",
                     "unset FORKD_VMM_RUNAS (default per-child: each VMM runs as a uid of its own, no capabilities)")
    if priv:
        return Check(SEC + "vmm-uid", WARN, f"{found} ({', '.join(priv[:5])}): started before the default changed",
                     "replace them (forkd kill ID, then fork again); new VMMs drop root")
    return Check(SEC + "vmm-uid", PASS, found, None)


def check_seccomp(rt: Runtime) -> Check:
    """QEMU installs forkd's -sandbox filter (probed: a QEMU with -M none and the filter, quit over QMP), and every
    running VMM is in seccomp filter mode (2)."""
    name = SEC + "seccomp"
    try:
        binary, policy = rt.driver.binary, rt.driver.seccomp_policy
    except ForkdError as exc:  # the driver cannot start without its VMM program
        return Check(name, WARN, f"{_line(exc.message)}: cannot probe -sandbox", "apt-get install qemu-system-x86")
    if not binary or not policy:
        return Check(name, WARN, f"the {rt.driver.name} driver runs no VMM with a syscall filter",
                     "FORKD_VMM_DRIVER=qemu (the fake driver is for tests)")
    res = run([binary, "-M", "none", "-display", "none", "-nodefaults", "-no-user-config", "-sandbox", policy,
               "-qmp", "stdio"], "qemu -sandbox probe", ok=None, timeout=20,
              input='{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n')
    if res.returncode != 0:
        return Check(name, WARN, f"QEMU refused -sandbox (exit {res.returncode}): {_line(res.stderr) or 'no message'}",
                     "install a QEMU built with seccomp (Debian's qemu-system-x86 is)")
    vmms = _running_vmms(rt)
    loose = [cid for cid, st in vmms if st.get("Seccomp", "").strip() != "2"]
    found = f"QEMU applies -sandbox {policy.split(',', 1)[1]}; {len(vmms)} running VMMs, {len(loose)} not in " \
            "seccomp mode 2"
    if loose:
        return Check(name, WARN, f"{found} ({', '.join(loose[:5])})", "replace them (forkd kill ID, then fork again)")
    return Check(name, PASS, found, None)


def _mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o7777


def check_daemon_socket(rt: Runtime) -> Check:
    """The daemon's socket is reachable only by its owner: the socket or its directory shuts others out."""
    sock = settings().daemon_socket or rt.layout.daemon_socket
    if not os.path.lexists(sock):
        return Check(SEC + "daemon-socket", PASS, f"no daemon socket at {sock} (no daemon running)", None)
    smode, dmode = _mode(sock), _mode(sock.parent)
    found = f"{sock} mode {smode:04o}, directory {dmode:04o}"
    if smode & 0o022 and dmode & 0o011:
        return Check(SEC + "daemon-socket", WARN, f"{found}: other local users can connect",
                     f"chmod 0700 {sock.parent}, or restart the daemon (it makes its socket private)")
    return Check(SEC + "daemon-socket", PASS, f"{found}: private to its owner", None)


def _open_dirs(rt: Runtime) -> list[Path]:
    """FORKD_HOME, its top-level directories and every snapshot directory that group or others can enter, list
    or write, or that another user owns."""
    home = rt.layout.home
    dirs = [home, *sorted(p for p in home.iterdir() if p.is_dir() and not p.is_symlink())] if home.is_dir() else []
    if rt.layout.snapshots.is_dir():
        dirs += sorted(p for p in rt.layout.snapshots.iterdir() if p.is_dir() and not p.is_symlink())
    me = os.geteuid()
    return [d for d in dirs if _mode(d) & 0o077 or os.lstat(d).st_uid != me]


def check_store_permissions(rt: Runtime) -> Check:
    bad = _open_dirs(rt)
    home = rt.layout.home
    if not bad:
        return Check(SEC + "store-perms", PASS, f"{home}, its directories and snapshots are private (0700, ours)",
                     None)
    shown = ", ".join(f"{d} ({_mode(d):04o})" for d in bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    return Check(SEC + "store-perms", WARN, f"{len(bad)} store directories open to other users: {shown}",
                 f"chmod -R go-rwx {home} (guest RAM and snapshots must be private to forkd)")


def check_egress() -> Check:
    """Children's egress: forkd's host table (`inet forkd_host`: traffic from the bridge denied unless a child's
    policy grants it) is loaded, and an older forkd's permissive table is gone (forkd.sandbox.firewall.posture)."""
    p = firewall.posture()
    found = (f"host table inet {firewall.HOST_TABLE} {'loaded' if p['host_table'] else 'not loaded'}; default child "
             f"egress {p['default_egress']}; net.ipv4.ip_forward={int(bool(p['ip_forward']))}")
    if p["legacy_table"]:
        return Check(SEC + "egress", WARN, f"{found}; an older forkd's permissive table ip {firewall.HOST_TABLE} is "
                     "loaded", f"nft delete table ip {firewall.HOST_TABLE} (or restart the daemon: it replaces it)")
    if not p["host_table"]:
        return Check(SEC + "egress", WARN, found, "start the daemon or fork an isolated child (forkd installs its "
                     "table); each child's own namespace denies by default either way")
    return Check(SEC + "egress", PASS, f"{found} (default deny)", None)


def check_protected_links() -> Check:
    values = {p.name: _sysctl(p) for p in PROTECTED_LINKS}
    found = ", ".join(f"fs.{k}={v}" for k, v in values.items())
    off = [f"fs.{k}=1" for k, v in values.items() if v == "0"]
    if off:
        return Check(SEC + "protected-links", WARN, f"{found}: root follows other users' links in sticky "
                     "directories (/dev/shm, /tmp)", SYSCTL_FIX.format(" ".join(off)))
    return Check(SEC + "protected-links", PASS, found, None)


def check_unprivileged_uffd() -> Check:
    """Live branch of a VMM that dropped root needs vm.unprivileged_userfaultfd=1 (QEMU 7.2, no /dev/userfaultfd)."""
    value = _sysctl(UNPRIVILEGED_UFFD_SYSCTL)
    found = f"vm.unprivileged_userfaultfd={value}, FORKD_VMM_RUNAS={settings().vmm_runas}"
    if value == "0" and settings().vmm_runas_per_child:
        return Check(SEC + "unprivileged-uffd", WARN, f"{found}: live branch fails (VMMs have no CAP_SYS_PTRACE)",
                     SYSCTL_FIX.format("vm.unprivileged_userfaultfd=1") + "; or branch --mode full")
    why = "unprivileged VMMs can be branched live" if value != "0" else "VMMs keep root, so they need no sysctl"
    return Check(SEC + "unprivileged-uffd", PASS, f"{found}: {why}", None)


def check_ksm(rt: Runtime) -> Check:
    """Page merging between children (SECURITY.md section 9): off unless FORKD_VMM_KSM=1."""
    state = rt.driver.page_merging()
    on = state is not None and state.get("run") == 1
    scanner = "no KSM in this kernel" if state is None else f"the kernel's scanner is {'on' if on else 'off'}"
    if not settings().vmm_ksm:
        return Check(SEC + "ksm", PASS, f"children's pages are never merged (FORKD_VMM_KSM off; {scanner})", None)
    if not on:
        return Check(SEC + "ksm", WARN, f"FORKD_VMM_KSM=1 but {scanner}: nothing is merged",
                     "echo 1 > /sys/kernel/mm/ksm/run (the host's choice), or unset FORKD_VMM_KSM")
    return Check(SEC + "ksm", WARN, f"children's pages are merged ({state.get('pages_sharing', 0)} pages sharing): a "
                 "timing side channel between children", "unset FORKD_VMM_KSM unless every child is one tenant's")




def check_swap() -> Check:
    """Idle page-out (forkd.core.idle): after FORKD_IDLE_PAGEOUT_SECS (default 60; 0 = never), to zram only unless
    FORKD_IDLE_PAGEOUT_DISK allows a swap that is not zram, which puts guest memory on a disk (SECURITY.md
    section 9)."""
    s, devices = settings(), swap_devices()
    secs, found, on_disk = s.idle_pageout_secs, f"swap: {', '.join(devices) or 'none'}", not_in_ram(devices)
    if secs <= 0:
        return Check(SEC + "swap", PASS, f"idle children are never paged out (FORKD_IDLE_PAGEOUT_SECS=0; {found})",
                     None)
    if not devices:
        return Check(SEC + "swap", PASS, "idle children are not paged out: the host has no swap (the idle-pageout "
                     "check says how to add the zram swap the defaults assume)", None)
    if on_disk and not s.idle_pageout_disk:
        return Check(SEC + "swap", PASS, f"idle children are not paged out: {', '.join(on_disk)} is not zram (or a "
                     "zram with a backing device), and guest memory would reach a disk (FORKD_IDLE_PAGEOUT_DISK=1 "
                     "allows it; plain zram does not need it)", None)
    if on_disk:
        return Check(SEC + "swap", WARN, f"idle children are paged out after {secs:g} s to {found}: "
                     f"{', '.join(on_disk)} is not zram, so guest memory reaches a disk (FORKD_IDLE_PAGEOUT_DISK=1)",
                     "swapoff those devices and use zram (" + ZRAM_FIX + "); or encrypt that swap, or unset "
                     "FORKD_IDLE_PAGEOUT_DISK (then nothing is paged out while they are on)")
    return Check(SEC + "swap", PASS, f"idle children are paged out after {secs:g} s to compressed RAM ({found})", None)


def security_steps(rt: Runtime) -> list[tuple[str, Callable[[], Check]]]:
    return [(SEC + "vmm-uid", lambda: check_vmm_uid(rt)), (SEC + "seccomp", lambda: check_seccomp(rt)),
            (SEC + "daemon-socket", lambda: check_daemon_socket(rt)),
            (SEC + "store-perms", lambda: check_store_permissions(rt)), (SEC + "egress", check_egress),
            (SEC + "protected-links", check_protected_links), (SEC + "unprivileged-uffd", check_unprivileged_uffd),
            (SEC + "ksm", lambda: check_ksm(rt)), (SEC + "swap", check_swap)]


# -- all of them -----------------------------------------------------------------------------------------------
