"""`forkd gc`: find and remove what crashed spawners and daemons left behind.

Policy (decided, and tested in tests/test_gc.py):
  * a child whose record says running and whose VMM is alive (pid + start time match) is ADOPTED: left running,
    its namespace and cgroup kept; `forkd kill` removes it like any other;
  * a child whose spawner died mid-start, or that is dead / OOM-killed / failed, is REAPED: its VMM is killed if
    the recorded pid + start time still match, then its namespace, veth, tap, lease, cgroup and files go;
  * kernel objects named by our prefixes whose owning child record is gone are removed: namespaces
    forkd-<home key>-<id> and their leases (only those leased for this FORKD_HOME, or for a home that no longer
    exists; a namespace without a lease only when its name is this home's), host veths fkh<id> with neither a
    lease nor a namespace, cgroups under this home's forkd/<home-hash>/ subtree. Another home's namespace is
    never touched, whatever the grace: its own gc removes it. A process inside such an
    orphaned namespace or cgroup can only be a VMM we put there, so it is killed (found by namespace inode or
    cgroup membership, never by name);
  * child directories without a record (sockets, logs) are deleted whatever their age: a record is born
    with its directory and leaves with it (forkd.sandbox.registry), so such a directory is never a spawn's;
  * temporaries (work and unpack directories, scratch memory, downloads, half-written files and flat images) are
    deleted exactly when their maker is gone: each carries its maker's pid + start time in its name
    (forkd.base.owners), so a live process's work is never touched whoever runs gc, and a reused pid is not
    mistaken for the maker. Names of an older forkd carrying a pid only are judged by that pid (on the shared
    tmpfs only files of forkd's own user, never another user's). Anything else in tmp/ is left alone.
  * a child's VMM whose record is gone or reaped (its spawner killed between starting QEMU and recording its pid,
    so the record names no pid and the cgroup holds nothing yet) is killed: a process of the configured QEMU
    binary whose command line names this home's directory of that child and that holds a file there open (its
    log: only a process forkd started can, the directory being 0700; a command line alone is anyone's);
    the registry is read again after the process scan, so a spawn that began meanwhile is left alone.
Any other VMM with no record, no namespace and no cgroup cannot be identified safely and is left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.mounts import remove_tree
from forkd.base.outside import sweep_outside
from forkd.base.owners import dead_under, owner_alive
from forkd.base.paths import Layout, stale_flat_dirs
from forkd.base.private import UnsafePath, check_private_dir
from forkd.base.procs import is_alive, kill_and_wait, kill_pidfd, pidfd_of, start_time
from forkd.base.settings import settings
from forkd.sandbox import cgroups, netns
from forkd.sandbox.netlayout import leases_dir
from forkd.sandbox.registry import RECORD, ChildRecord, Registry
from forkd.sandbox.supervisor import release_isolation

log = logging.getLogger("forkd.gc")
GRACE_SECONDS = 60.0  # objects younger than this with no record may be a spawn in progress
# temporaries named by a forkd before owned names (forkd.base.owners): the maker's pid only
LEGACY = re.compile(r"^(?:forkd-.+-(\d+)(?:-[0-9a-f]+)?\.mem|(?:p|l|b|branch-.+|unpack)-(\d+)-[0-9a-f]+"
                    r"|pull-(\d+)-[0-9a-f]+\.tar\.zst|rm-.+-(\d+)-\d+|\..+\.(?:tmp|new)-(\d+)-(?:\d+-)?[0-9a-f]+)$")
FLAT_IMAGE = re.compile(r"^[0-9a-f]{64}\.mem$")
SNAPSHOT_MANIFEST = "snapshot.json"  # the store's name for it (forkd.store.snapshot.MANIFEST; no import across)
LEGACY_WORKDIR = re.compile(r"^(?:p|l|b|branch-.+)-(\d+)-[0-9a-f]+$")


@dataclass
class GcReport:
    adopted: list[str] = field(default_factory=list)  # live, recorded children left running
    reaped: list[str] = field(default_factory=list)  # records removed (dead, failed, abandoned mid-start)
    processes: list[int] = field(default_factory=list)  # VMM pids killed
    netns: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    leases: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)  # child directories (sockets, logs) without a record
    memory_files: list[str] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)  # owned temporaries whose maker died (forkd.base.owners)
    flat_dirs: list[str] = field(default_factory=list)  # tmpfs flat images of stores that no longer exist
    dry_run: bool = False

    @property
    def leftovers(self) -> int:
        return sum(len(getattr(self, k)) for k in ("reaped", "processes", "netns", "veths", "leases", "cgroups",
                                                   "dirs", "memory_files", "temporaries", "flat_dirs"))

    def to_json(self) -> dict:
        d = {k: list(getattr(self, k)) for k in ("adopted", "reaped", "processes", "netns", "veths", "leases",
                                                 "cgroups", "dirs", "memory_files", "temporaries", "flat_dirs")}
        d["dry_run"] = self.dry_run
        d["leftovers"] = self.leftovers
        return d


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return 0.0


def _seen(pids: list[int]) -> list[tuple[int, int]]:
    """(pid, start time) of each process still there: its identity as the scan saw it."""
    return [(pid, st) for pid in pids if (st := start_time(pid)) is not None]


def _kill_unrecorded(pid: int, started: int, report: GcReport, dry_run: bool) -> None:
    """Kill a process the scan found to be an orphan of ours, only if it is still the process the scan saw (start
    time, checked through a pidfd that then carries the signal: a pid reused meanwhile is never hit)."""
    if pid == os.getpid() or pid in report.processes:
        return
    fd = pidfd_of(pid, started)
    if fd is None:
        return
    try:
        report.processes.append(pid)
        if not dry_run:
            kill_pidfd(fd)
    finally:
        os.close(fd)


def collect(layout: Layout, dry_run: bool = False, grace: float = GRACE_SECONDS) -> GcReport:
    report = GcReport(dry_run=dry_run)
    registry = Registry(layout)
    home = str(layout.home)
    keep: set[str] = set()  # child ids whose kernel objects stay
    for rec in registry.list():
        if _owned(rec, grace):
            keep.add(rec.id)
            if rec.status == "running":
                report.adopted.append(rec.id)
            continue
        report.reaped.append(rec.id)
        if rec.pid is not None and is_alive(rec.pid, rec.started):
            report.processes.append(rec.pid)
        if not dry_run:
            if rec.pid is not None:
                kill_and_wait(rec.pid, rec.started)
            release_isolation(rec)
            registry.remove(rec.id)
    _collect_child_vmms(layout, registry, report, dry_run, grace)
    _collect_child_dirs(layout, keep, report, dry_run)
    _collect_network(home, keep, lambda cid: cid in keep or _owned_now(registry, cid, grace), report, dry_run, grace)
    _collect_cgroups(home, keep, report, dry_run)
    _collect_files(layout, report, dry_run, grace)
    _collect_build_vmms(layout, report, dry_run)
    _collect_unowned_flats(layout, report, dry_run, grace)
    for d in stale_flat_dirs():
        report.flat_dirs.append(str(d))
        if not dry_run:
            _remove(d)
    return report


def _owned_now(registry: Registry, child_id: str, grace: float) -> bool:
    """Whether a child is someone's by its record as it is now: a spawn that began after the registry was read
    saved its record before it took a lease or made a namespace."""
    try:
        return _owned(registry.get(child_id), grace)
    except ForkdError:
        return False


def _collect_child_dirs(layout: Layout, keep: set[str], report: GcReport, dry_run: bool) -> None:
    """Child directories (sockets, logs) without a record, whatever their age: a record is born with its
    directory and leaves with it (forkd.sandbox.registry), so no spawn in progress has one, and a VMM still
    naming one was killed above. A record-less directory of a forkd before that rule is removed too; a half-made
    or half-removed one of this forkd is an owned temporary (`.<id>.new-...`, `.<id>.rm-...`), gone with its
    maker (_collect_files)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(layout.children) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".") and entry.name not in keep \
                    and not os.path.lexists(os.path.join(entry.path, RECORD)):
                report.dirs.append(entry.path)
                if not dry_run:
                    _remove(Path(entry.path))


def _owned(rec: ChildRecord, grace: float) -> bool:
    """Whether a child record is someone's: running, or a live spawner (`starting`) or stopper (`stopping`: the
    status says its stopper lives) owns it, or it is a spawn too young to judge."""
    status = rec.status
    if status in ("running", "stopping"):
        return True
    if status == "starting" and rec.spawner_pid:
        return is_alive(rec.spawner_pid, rec.spawner_started)
    return status == "starting" and time.time() - rec.created_at < grace


def _collect_child_vmms(layout: Layout, registry: Registry, report: GcReport, dry_run: bool, grace: float) -> None:
    """VMMs of children nobody owns any more: the configured QEMU naming this home's directory of a child whose
    record is gone (reaped above, or never got the VMM's pid). Found by the crash harness: kill -9 of a spawner
    between QEMU's start and the record of its pid left that QEMU waiting for its state forever."""
    found = []
    for d in _qemu_procs():
        ids = _held_dirs(d, layout.children)
        started = start_time(int(d.name))
        if ids and started is not None and int(d.name) not in report.processes:
            found.append((int(d.name), started, ids))
    if not found:
        return
    owned = {r.id for r in registry.list() if _owned(r, grace)}  # read after the scan: a new spawn is owned
    for pid, started, ids in found:
        if not ids & owned:
            _kill_unrecorded(pid, started, report, dry_run)


def _held_dirs(proc: Path, root: Path) -> set[str]:
    """The names of the directories beneath `root` in which the process holds a file open (a VMM forkd started
    holds its log in its own). What the kernel says a descriptor is cannot be forged; a command line is anyone's
    to rewrite (a compromised VMM naming a live child's directory in its argv is still judged by its own)."""
    prefix = str(root) + "/"
    names = set()
    with contextlib.suppress(OSError), os.scandir(proc / "fd") as it:
        for fd in it:
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith(prefix) and "/" in target[len(prefix):]:
                    names.add(target[len(prefix):].split("/", 1)[0])
    return names


def _collect_network(home: str, keep: set[str], owns: Callable[[str], bool], report: GcReport, dry_run: bool,
                     grace: float) -> None:
    """Namespaces, veths and leases of this home that no child owns. The kernel's objects are listed before the
    leases are read: a lease is taken before its namespace and veth exist and dropped after they are gone
    (forkd.sandbox.netns), so whatever was listed and is still a child's, of any home, has its lease in the read
    that follows. Another home's namespace is never taken, leased or not (its name carries its home), unless its
    lease names a home that no longer exists."""
    links = netns.host_links()  # before the namespaces: a veth is made after its namespace
    names = netns.list_netns()
    leased = _collect_leases(home, owns, report, dry_run)
    mine = cgroups.home_key(home)
    for name in names:
        owner, child = netns.parse_netns(name)
        if name in leased or name in report.netns or (owner is not None and owner != mine) or owns(child):
            continue
        # no lease: a leftover of this home's (or, by an older forkd's name, of no known home: judged by age alone)
        if _age(netns.NETNS_DIR / name) <= (grace if owner is not None else max(grace, GRACE_SECONDS)):
            continue
        _teardown(netns.ChildNet(name, netns.host_if_name(child), "", "", child), report, dry_run)
    _collect_veths(links, names, leased, keep, report, dry_run)


def _collect_leases(home: str, owns: Callable[[str], bool], report: GcReport,
                    dry_run: bool) -> dict[str, netns.ChildNet]:
    """Tear down this home's leased children that no record owns, and any lease whose home is gone; return the
    leases that stay, by namespace. A lease that cannot be read names no home (an older forkd wrote them in place,
    so one may be half-written this instant): it goes only after GRACE_SECONDS, whatever the caller's grace. A
    lease being written (an owned temporary, forkd.base.owners) goes once its writer is gone."""
    leased: dict[str, netns.ChildNet] = {}
    for path in dead_under(leases_dir(), 1):
        report.leases.append(path.name)
        if not dry_run:
            path.unlink(missing_ok=True)
    for path, lease in netns.leases():
        if lease is None:
            if _age(path) > GRACE_SECONDS:
                report.leases.append(path.name)
                if not dry_run:
                    path.unlink(missing_ok=True)
            continue
        mine = os.path.realpath(lease.home) == os.path.realpath(home)
        if (mine and not owns(lease.child)) or not os.path.isdir(lease.home):
            _teardown(lease, report, dry_run)
        else:
            leased[lease.netns] = lease
    return leased


def _collect_veths(links: list[str], names: list[str], leased: dict[str, netns.ChildNet], keep: set[str],
                   report: GcReport, dry_run: bool) -> None:
    """Host veths no lease names whose namespace is gone (a namespace a process still holds after its name was
    removed keeps its veth). A veth whose namespace is still there is judged with it: another home's is left."""
    live = {lease.host_if for lease in leased.values()} | {netns.host_if_name(c) for c in keep}
    named = {netns.host_if_name(netns.child_of(n)) for n in names if n not in report.netns}
    for ifname in links:
        if ifname in live or ifname in named or ifname in report.veths:
            continue
        report.veths.append(ifname)
        if not dry_run:
            netns.delete_link(ifname)


def _teardown(lease: netns.ChildNet, report: GcReport, dry_run: bool) -> None:
    if netns.exists(lease.netns):
        report.netns.append(lease.netns)
        for pid, started in _seen(netns.pids_in(lease.netns)):
            _kill_unrecorded(pid, started, report, dry_run)
    if lease.host_if in netns.host_links():
        report.veths.append(lease.host_if)
    if lease.addr:
        report.leases.append(lease.addr)
    if not dry_run:
        netns.teardown(lease)


def _collect_cgroups(home: str, keep: set[str], report: GcReport, dry_run: bool) -> None:
    for g in cgroups.home_groups(home):
        if g.name in keep:
            continue
        report.cgroups.append(str(g))
        for pid, started in _seen(cgroups.procs(g)):
            _kill_unrecorded(pid, started, report, dry_run)
        if not dry_run:
            cgroups.remove_group([g])
    if not dry_run:  # empty per-home parent groups (of any home: only empty ones can go; spawns re-create them)
        cgroups.prune_empty_homes()


def _scratch_dirs(layout: Layout) -> list[Path]:
    """Where scratch memory files may be: this home's private tmpfs directory and tmp/ (when they are private),
    and the shared tmpfs itself (where older forkd versions put them; only our own files there are touched)."""
    out = [settings().shm]
    for d in (layout.shm_dir, layout.tmp):
        with contextlib.suppress(FileNotFoundError, UnsafePath):
            if d is not None:
                out.append(check_private_dir(d))
    return out


def _remove(path: Path) -> bool:
    """Delete a file, or a directory tree without walking into a mount a killed builder left in it (mmdebstrap's
    bind of the host's /dev/shm: forkd.base.mounts). False when a mount that cannot be detached keeps the tree
    (logged; it is not reported as removed)."""
    if path.is_dir() and not path.is_symlink():
        left = remove_tree(path)
        if left:
            log.warning("gc: left %s in place: mounts beneath it could not be detached: %s", path,
                        ", ".join(map(str, left)))
            return False
    else:
        path.unlink(missing_ok=True)
    return True


def _collect_files(layout: Layout, report: GcReport, dry_run: bool, grace: float) -> None:
    """Owned temporaries (forkd.base.owners) whose maker is gone, anywhere forkd makes them: tmp/, the home's
    tmpfs directory (scratch RAM, half-written flat images), beside the files of the home (atomic writes), and
    outside the home where a note in tmp/ names one (a pack's output: forkd.base.outside); then names of an older
    forkd that carry a pid only (LEGACY), judged by that pid."""
    with contextlib.suppress(FileNotFoundError, UnsafePath):  # the notes first: each goes with the temporary it names
        report.temporaries += [str(p) for p in sweep_outside(check_private_dir(layout.tmp), dry_run)]
    roots = [(layout.home, 3)]  # tmp/ and cache/flat are inside
    with contextlib.suppress(FileNotFoundError, UnsafePath):
        if layout.shm_dir is not None:
            roots.append((check_private_dir(layout.shm_dir), 2))  # flat/ inside
    for root, depth in roots:
        for path in dead_under(root, depth):
            if str(path) in report.temporaries:  # a note a dry run listed already
                continue
            if dry_run or _remove(path):
                report.temporaries.append(str(path))
    for d in [*_scratch_dirs(layout), *([layout.flat_cache] if layout.shm_dir else [])]:
        shared = d == settings().shm  # the shared tmpfs: only our own user's forkd-*.mem files, nothing else
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, UnsafePath), os.scandir(d) as it:
            for entry in it:
                m = LEGACY.match(entry.name)
                if m is None or entry.is_symlink() or (shared and not (
                        entry.is_file(follow_symlinks=False) and m.group(1))):
                    continue
                st = entry.stat(follow_symlinks=False)
                pid = int(next(g for g in m.groups() if g))
                if st.st_uid == os.geteuid() and not is_alive(pid, None) and _age(Path(entry.path)) > 1.0:
                    (report.memory_files if entry.name.endswith(".mem") else report.dirs).append(entry.path)
                    if not dry_run:
                        _remove(Path(entry.path))


def _collect_build_vmms(layout: Layout, report: GcReport, dry_run: bool) -> None:
    """VMMs of builds (a parent's boot, a layer, a branch's helper) whose builder died (kill -9 of the daemon or
    CLI mid-build): processes of the configured QEMU binary holding a file open in a work directory of this
    home's tmp/ (`an owned name, forkd.base.owners) whose owner is gone. They have no child record and no
    cgroup; without this they ran (and held their scratch RAM) forever. A live builder's VMM is left alone."""
    for d in _qemu_procs():
        pid, started = int(d.name), start_time(int(d.name))
        if pid in report.processes or started is None:
            continue
        alive = [_workdir_owner_alive(name) for name in _held_dirs(d, layout.tmp)]
        alive = [a for a in alive if a is not None]
        if alive and not any(alive):
            _kill_unrecorded(pid, started, report, dry_run)


def _workdir_owner_alive(name: str) -> bool | None:
    """Whether the maker of a work directory named `name` runs: an owned name (forkd.base.owners), or an older
    forkd's `<kind>-<pid>-<random>` judged by its pid; None for any other name."""
    alive = owner_alive(name)
    if alive is None and (m := LEGACY_WORKDIR.match(name)):
        alive = is_alive(int(m.group(1)), None)
    return alive


def _qemu_procs() -> list[Path]:
    """/proc/<pid> of every process running the configured QEMU binary (that we may look at)."""
    qemu = os.path.realpath(shutil.which(settings().qemu) or settings().qemu)
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.path.realpath(os.readlink(d / "exe")) == qemu:
                out.append(d)
        except OSError:
            continue  # gone, or not ours to look at
    return out


def _owned_flats(layout: Layout) -> set[str]:
    """Flat image names a snapshot of this home records as its memory content (any status but failed)."""
    owned = set()
    for manifest in layout.snapshots.glob(f"*/{SNAPSHOT_MANIFEST}"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            raw = json.loads(manifest.read_text())
            if raw.get("status") != "failed" and isinstance(raw.get("memory_sha256"), str):
                owned.add(f"{raw['memory_sha256']}.mem")
    return owned


def _collect_unowned_flats(layout: Layout, report: GcReport, dry_run: bool, grace: float) -> None:
    """Flat images (RAM on tmpfs) no snapshot records: kept by a build whose writer died between keeping its
    image and committing (its snapshot is failed), or left by a removed snapshot. The flat cache is a cache (the
    store materializes an image again when needed), so one older than `grace` that no process maps goes."""
    with contextlib.suppress(FileNotFoundError, UnsafePath):
        flat = layout.check_flat_cache()
        if flat is None:
            return
        owned, mapped = _owned_flats(layout), set()
        for d in _qemu_procs():
            with contextlib.suppress(OSError):
                mapped.update(line.split(None, 5)[-1] for line in (d / "maps").read_text().splitlines()
                              if str(flat) in line)
        for entry in os.scandir(flat):
            if FLAT_IMAGE.match(entry.name) and entry.name not in owned and entry.path not in mapped and \
                    entry.is_file(follow_symlinks=False) and _age(Path(entry.path)) > grace:
                report.memory_files.append(entry.path)
                if not dry_run:
                    Path(entry.path).unlink(missing_ok=True)
