"""`forkd doctor`: host checks that say, one line each, whether this machine can run forkd and how to fix it,
then its security posture (checks named `security:...`: VMM uid, seccomp, daemon socket, store permissions, egress
table, link protection, unprivileged userfaultfd; SECURITY.md says what each protects).

Each check returns a `Check` with status PASS, WARN or FAIL, a one-line `detail` of what was found and, when it
is not PASS, a one-line `fix`. Checks probe for real where that is cheap and safe (the userfaultfd syscall, an
`unshare --net`), never mock. A check that raises unexpectedly becomes a FAIL for that check only, so `run_checks`
never crashes.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import re
import shutil
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forkd.base import idrange
from forkd.base.errors import ForkdError
from forkd.base.procs import is_alive, run
from forkd.base.settings import settings
from forkd.store.snapshot import CorruptManifest, Snapshot

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime
    from forkd.image.build import Image

Progress = Callable[[str], None]

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
GIB = 1 << 30
MIN_QEMU_MAJOR = 7
STORE_FAIL_BYTES, STORE_WARN_BYTES = 1 * GIB, 5 * GIB
SHM_WARN_BYTES = 2 * GIB
KVM_DEVICE = "/dev/kvm"

# userfaultfd(2) and UFFDIO_API (linux/userfaultfd.h)
USERFAULTFD_SYSCALL = {"x86_64": 323, "aarch64": 282}
UFFD_USER_MODE_ONLY = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # userfaultfd(2) has no libc wrapper
UFFD_API = 0xAA
UFFDIO_API = 0xC018AA3F  # _IOWR(0xAA, 0x3F, struct uffdio_api {u64 api; u64 features; u64 ioctls;})
UFFD_FEATURE_PAGEFAULT_FLAG_WP = 1 << 0
UNPRIVILEGED_UFFD_SYSCTL = Path("/proc/sys/vm/unprivileged_userfaultfd")
UFFD_FIX = "needs Linux >= 5.7 with userfaultfd; live branch falls back to pause-and-save"

CLONE_NEWNET = 0x40000000
NETNS_FIX = "run as root (CAP_SYS_ADMIN) for per-child network namespaces"


@dataclass(frozen=True)
class Check:
    name: str  # short id, e.g. "qemu", "kernel", "image", "accelerator"
    status: str  # "PASS" | "WARN" | "FAIL"
    detail: str  # one line: what was found
    fix: str | None  # one-line fix when status != PASS


def _line(text: object) -> str:
    """First line of `text`, so details and fixes stay one line."""
    s = str(text).strip()
    return s.splitlines()[0] if s else ""


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    """Run one check; an unexpected exception becomes a FAIL for this check, never a crash."""
    try:
        return fn()
    except ForkdError as exc:
        return Check(name, FAIL, _line(exc.message), _line(exc.hint) if exc.hint else "see the error above")
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of raising
        return Check(name, FAIL, f"check failed: {type(exc).__name__}: {_line(exc)}",
                     "this is a doctor bug or an unusual host; rerun with the error above in hand")


# -- qemu ------------------------------------------------------------------------------------------------------
def check_qemu(rt: Runtime) -> Check:
    try:
        driver = rt.driver
    except ForkdError as exc:  # the driver cannot start without its VMM program
        return Check("qemu", FAIL, _line(exc.message), _line(exc.hint or "apt-get install qemu-system-x86"))
    binary = driver.binary
    version = driver.version()
    found = f"QEMU {version} at {binary}"
    major = version.split(".")[0]
    if not major.isdigit():
        return Check("qemu", WARN, f"{found}: cannot parse the version",
                     f"check that `{binary} --version` works; forkd needs QEMU >= {MIN_QEMU_MAJOR}")
    if int(major) < MIN_QEMU_MAJOR:
        return Check("qemu", WARN, f"{found}: older than {MIN_QEMU_MAJOR}.0",
                     f"upgrade to QEMU >= {MIN_QEMU_MAJOR} (x-ignore-shared restore is untested on older ones)")
    return Check("qemu", PASS, found, None)


def check_disk_tools() -> Check:
    """qemu-img and mkfs.ext4: only disk-backed images (--rootfs disk) need them."""
    missing = [t for t in ("qemu-img", "mkfs.ext4") if not shutil.which(t)]
    if missing:
        return Check("disk-tools", WARN, f"{', '.join(missing)} not found: disk-backed images (--rootfs disk) "
                     "cannot be built or forked", "apt-get install qemu-utils e2fsprogs")
    return Check("disk-tools", PASS, "qemu-img and mkfs.ext4 found (disk-backed images)", None)


# -- image, kernel, accelerator ----------------------------------------------------------------------------
def _load_image(rt: Runtime) -> tuple[Image | None, Exception | None]:
    try:
        return rt.image(), None
    except Exception as exc:  # noqa: BLE001 - reported by check_image
        return None, exc


def check_image(image: Image | None, error: Exception | None) -> Check:
    if image is None:
        if isinstance(error, ForkdError):
            return Check("image", FAIL, _line(error.message), "forkd image build")
        return Check("image", FAIL, f"guest image unreadable: {type(error).__name__}: {_line(error)}",
                     "forkd image build")
    if not image.initrd.is_file():
        return Check("image", FAIL, f"image {image.id}: initrd {image.initrd} is missing", "forkd image build")
    return Check("image", PASS, f"image {image.id}, initrd {_size(image.initrd.stat().st_size)}", None)


def check_kernel(image: Image | None) -> Check:
    if image is None:
        return Check("kernel", WARN, "skipped: needs the image", "forkd image build")
    if not image.kernel.is_file():
        return Check("kernel", FAIL, f"kernel {image.kernel} is missing", "forkd image build")
    return Check("kernel", PASS, f"{image.kernel} ({_size(image.kernel.stat().st_size)}, "
                                 f"sha256 {image.kernel_sha256[:12]})", None)


def check_accelerator(rt: Runtime, image: Image | None, progress: Progress, reprobe: bool) -> Check:
    if image is None:
        return Check("accelerator", WARN, "skipped: needs the image", "forkd image build")
    decision, cached = rt.accelerator(image, progress, reprobe=reprobe)
    what = "kvm (hardware virtualization)" if decision.accel == "kvm" else "tcg (software emulation, slower)"
    return Check("accelerator", PASS, f"{what}: {decision.reason}{' (cached)' if cached else ''}", None)


def check_kvm_device() -> Check:
    if not os.path.exists(KVM_DEVICE):
        return Check("kvm-device", WARN, f"{KVM_DEVICE} does not exist; guests run under TCG",
                     "load kvm_intel/kvm_amd or expose /dev/kvm to this host; TCG works without it")
    if os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return Check("kvm-device", PASS, f"{KVM_DEVICE} is present and read-write; the boot probe decides "
                                         "whether KVM actually works", None)
    return Check("kvm-device", PASS, f"{KVM_DEVICE} is present but not read-write for this user; the boot probe "
                                     "decides (it will pick TCG)", None)


# -- userfaultfd write-protect ---------------------------------------------------------------------------------
def _sysctl(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "absent"


def _open_userfaultfd(nr: int) -> tuple[int, str]:
    """(fd, mode) from userfaultfd(2), retrying with UFFD_USER_MODE_ONLY; raises OSError when both fail."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    fd = _LIBC.syscall(ctypes.c_long(nr), ctypes.c_int(flags))
    if fd >= 0:
        return fd, "full"
    err = ctypes.get_errno()
    if err in (errno.EPERM, errno.EINVAL):
        fd = _LIBC.syscall(ctypes.c_long(nr), ctypes.c_int(flags | UFFD_USER_MODE_ONLY))
        if fd >= 0:
            return fd, "user-mode-only"
        err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))


def probe_userfaultfd_wp() -> tuple[bool, str]:
    """Open a userfaultfd, handshake UFFDIO_API and look for write-protect support. (available, what was seen)."""
    nr = USERFAULTFD_SYSCALL.get(platform.machine())
    if nr is None:
        return False, f"no userfaultfd syscall number known for {platform.machine()}"
    try:
        fd, mode = _open_userfaultfd(nr)
    except OSError as exc:
        return False, f"userfaultfd() failed: {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})"
    try:
        buf = bytearray(struct.pack("=QQQ", UFFD_API, 0, 0))
        fcntl.ioctl(fd, UFFDIO_API, buf)
        _, features, _ = struct.unpack("=QQQ", buf)
    except OSError as exc:
        return False, f"UFFDIO_API failed: {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})"
    finally:
        os.close(fd)
    if not features & UFFD_FEATURE_PAGEFAULT_FLAG_WP:
        return False, f"userfaultfd ({mode}) lacks write-protect (features {features:#x})"
    return True, f"userfaultfd write-protect available ({mode}, features {features:#x})"


def check_userfaultfd() -> Check:
    ok, what = probe_userfaultfd_wp()
    detail = f"{what}; vm.unprivileged_userfaultfd={_sysctl(UNPRIVILEGED_UFFD_SYSCTL)}"
    if ok:
        return Check("userfaultfd-wp", PASS, detail, None)
    fix = UFFD_FIX
    if "EPERM" in what:
        fix = ("run as root or set sysctl vm.unprivileged_userfaultfd=1; until then a live branch is taken by pages "
               "only (a child without a disk that wrote at most 1/40 of its RAM), else refused: --mode diff or full")
    return Check("userfaultfd-wp", WARN, detail, fix)


def check_vmm_uids() -> Check:
    """The VMM uid range is given to no one else as subordinate ids (forkd.base.idrange)."""
    base, count = settings().vmm_uid_base, settings().vmm_uid_count
    detail = f"VMMs drop to uids [{base}, {base + count})"
    if not settings().vmm_runas_per_child:
        return Check("vmm-uids", WARN, "FORKD_VMM_RUNAS=root: VMMs keep root", "unset FORKD_VMM_RUNAS")
    try:
        idrange.vmm_range()
    except ForkdError as exc:
        return Check("vmm-uids", FAIL, _line(exc.message), _line(exc.hint or ""))
    return Check("vmm-uids", PASS, detail + "; no overlap with /etc/subuid or /etc/subgid", None)


def check_pagemap_scan(rt: Runtime) -> Check:
    ok, what = rt.driver.diff_capture_probe()
    if ok:
        return Check("pagemap-scan", PASS, what, None)
    return Check("pagemap-scan", WARN, what, "diff branches need Linux 6.7+ (PAGEMAP_SCAN); on this kernel branch "
                 "with --mode live or --mode full (sb.fork(n) and fork --from-sandbox fail here)")


# -- disk and shared memory ---------------------------------------------------------------------------------
def check_store_space(rt: Runtime) -> Check:
    home = rt.layout.home
    free = shutil.disk_usage(home).free
    detail = f"{_gib(free)} free for snapshots under {home}"
    fix = f"free space on the filesystem of {home} or point FORKD_HOME at a larger one"
    if free < STORE_FAIL_BYTES:
        return Check("store-space", FAIL, detail, fix)
    if free < STORE_WARN_BYTES:
        return Check("store-space", WARN, detail, fix)
    return Check("store-space", PASS, detail, None)


def check_shm_space() -> Check:
    shm = settings().shm
    if not shm.is_dir():
        return Check("shm-space", FAIL, f"{shm} does not exist (parent memory is staged there)",
                     "mount a tmpfs at /dev/shm or set FORKD_SHM to a tmpfs directory")
    free = shutil.disk_usage(shm).free
    detail = f"{_gib(free)} free in {shm} for parent memory while snapshotting"
    if free < SHM_WARN_BYTES:
        return Check("shm-space", WARN, detail, f"enlarge it (mount -o remount,size=8G {shm}) or set FORKD_SHM")
    return Check("shm-space", PASS, detail, None)


# -- cgroup ----------------------------------------------------------------------------------------------------
def _v1_memory_usable(root: Path) -> bool:
    mem = root / "memory"
    return (mem / "memory.limit_in_bytes").exists() and os.access(mem, os.W_OK)


def _v2_memory_usable(unified: Path, v2_controllers: list[str]) -> bool:
    return "memory" in v2_controllers and os.access(unified, os.W_OK)


def cgroup_info(root: Path) -> tuple[str, list[str], list[str], bool]:
    """(version, v1 controllers, v2 controllers, memory usable) for the hierarchy mounted at `root`."""
    wanted = ("memory", "cpu")
    if (root / "cgroup.controllers").exists():
        v2 = (root / "cgroup.controllers").read_text().split()
        return "v2", [], [c for c in wanted if c in v2], _v2_memory_usable(root, v2)
    v1 = [c for c in wanted if (root / c).is_dir()]
    unified = root / "unified"
    if unified.is_dir() and v1:
        try:
            v2 = (unified / "cgroup.controllers").read_text().split()
        except OSError:
            v2 = []
        usable = _v1_memory_usable(root) or _v2_memory_usable(unified, v2)
        return "hybrid", v1, [c for c in wanted if c in v2], usable
    return "v1", v1, [], _v1_memory_usable(root)


def check_cgroup(root: Path | None = None) -> Check:
    """Of `root`, default $FORKD_CGROUP_ROOT (where forkd places children)."""
    version, v1, v2, memory_ok = cgroup_info(root or settings().cgroup_root)
    parts = []
    if version != "v2":
        parts.append(f"v1 controllers: {', '.join(v1) or 'none'}")
    if version != "v1":
        parts.append(f"v2 controllers: {', '.join(v2) or 'none'}")
    detail = f"cgroup {version} ({'; '.join(parts)})"
    if memory_ok:
        return Check("cgroup", PASS, f"{detail}; memory controller usable", None)
    return Check("cgroup", WARN, f"{detail}; no writable memory controller",
                 "enable the memory cgroup controller and run as root to cap children's memory")


# -- network namespaces ----------------------------------------------------------------------------------------
def netns_by_unshare(binary: str) -> tuple[bool, str]:
    """Create (and drop) a network namespace with util-linux `unshare --net true`."""
    try:
        res = run([binary, "--net", "true"], "unshare --net", ok=None, timeout=20)
    except ForkdError as exc:  # hung past the timeout
        return False, exc.message
    if res.returncode == 0:
        return True, "created a network namespace (unshare --net)"
    return False, f"unshare --net failed (exit {res.returncode}): {_line(res.stderr) or 'no message'}"


def netns_by_fork() -> tuple[bool, str]:
    """Create a network namespace in a forked child with unshare(CLONE_NEWNET); the parent is untouched."""
    unshare = ctypes.CDLL(None, use_errno=True).unshare  # resolved before fork: the child only calls it
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if unshare(CLONE_NEWNET) == 0 else 10 + ctypes.get_errno()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return True, "created a network namespace (unshare(CLONE_NEWNET) in a child process)"
    err = code - 10
    name = errno.errorcode.get(err, str(code)) if err > 0 else f"exit {code}"
    return False, f"unshare(CLONE_NEWNET) failed: {name}"


def check_netns() -> Check:
    binary = shutil.which("unshare")
    ok, what = netns_by_unshare(binary) if binary else netns_by_fork()
    return Check("netns", PASS, what, None) if ok else Check("netns", WARN, what, NETNS_FIX)


# -- snapshots -------------------------------------------------------------------------------------------------
def _corrupt_tag(exc: CorruptManifest) -> str:
    m = re.search(r"snapshot manifest (.+)/snapshot\.json ", exc.message)
    return Path(m.group(1)).name if m else _line(exc.message)


def _status_label(snap: Snapshot) -> str:
    if snap.status == "writing" and snap.writer_pid and not is_alive(snap.writer_pid, snap.writer_started):
        return f"{snap.tag} (writing, writer gone)"
    return f"{snap.tag} ({snap.status})"


def check_snapshots(rt: Runtime) -> Check:
    entries = rt.store.list()
    snaps = [e for e in entries if isinstance(e, Snapshot)]
    corrupt = [_corrupt_tag(e) for e in entries if isinstance(e, CorruptManifest)]
    counts = Counter(s.status for s in snaps)
    if corrupt:
        counts["corrupt"] = len(corrupt)
    if not entries:
        return Check("snapshots", PASS, "no snapshots yet", None)
    summary = f"{len(entries)} snapshots: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    bad = [s for s in snaps if s.status in ("failed", "writing")]
    if corrupt:
        return Check("snapshots", WARN, f"{summary}; unreadable manifest: {', '.join(corrupt)}",
                     f"forkd snapshot rm --force TAG (for {', '.join(corrupt)})")
    if bad:
        return Check("snapshots", WARN, f"{summary}; not ready: {', '.join(_status_label(s) for s in bad)}",
                     f"forkd snapshot rm TAG (for {', '.join(s.tag for s in bad)})")
    return Check("snapshots", PASS, summary, None)


# -- isolation leftovers ----------------------------------------------------------------------------------------
def check_leftovers(rt: Runtime) -> Check:
    """What `forkd gc` would remove (a dry run of its scan): orphaned namespaces, veths, cgroups, VMMs, files."""
    rep = rt.gc(dry_run=True)
    kinds = [f"{len(rep[k])} {k.replace('_', ' ')}" for k in ("reaped", "processes", "netns", "veths", "leases",
                                                               "cgroups", "dirs", "memory_files", "temporaries")
             if rep[k]]
    adopted = f"{len(rep['adopted'])} live children"
    if not kinds:
        return Check("leftovers", PASS, f"nothing orphaned; {adopted}", None)
    return Check("leftovers", WARN, f"orphaned: {', '.join(kinds)}; {adopted}", "forkd gc")


def check_idle_pageout() -> Check:
    """Whether the swap the idle page-out and sleep defaults assume is there (forkd.core.idle.pageout_check)."""
    from forkd.core.idle import pageout_check
    from forkd.vmm.pageout import meminfo_kib, not_in_ram, swap_devices, swap_total_kib

    s, devices = settings(), swap_devices()
    status, detail, fix = pageout_check(s.idle_pageout_secs, s.idle_sleep, devices, not_in_ram(devices),
                                        s.idle_pageout_disk, swap_total_kib(), meminfo_kib("MemTotal"))
    return Check("idle-pageout", status, detail, fix)


# -- security posture (SECURITY.md): each check named security:<what> ----------------------------------------
def run_checks(rt: Runtime, reprobe: bool = False, progress: Progress = lambda s: None) -> list[Check]:
    """Run every host check in order; never raises."""
    from forkd.core.posture import security_steps  # posture builds on this module's Check

    image, image_error = _load_image(rt)
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("qemu", lambda: check_qemu(rt)),
        ("disk-tools", check_disk_tools),
        ("image", lambda: check_image(image, image_error)),
        ("kernel", lambda: check_kernel(image)),
        ("accelerator", lambda: check_accelerator(rt, image, progress, reprobe)),
        ("userfaultfd-wp", check_userfaultfd),
        ("pagemap-scan", lambda: check_pagemap_scan(rt)),
        ("vmm-uids", check_vmm_uids),
        ("store-space", lambda: check_store_space(rt)),
        ("shm-space", check_shm_space),
        ("cgroup", check_cgroup),
        ("netns", check_netns),
        ("leftovers", lambda: check_leftovers(rt)),
        ("snapshots", lambda: check_snapshots(rt)),
        ("kvm-device", check_kvm_device),
        ("idle-pageout", check_idle_pageout),
        *security_steps(rt),
    ]
    results = []
    for name, fn in steps:
        progress(f"checking {name}")
        results.append(_guard(name, fn))
    return results
