"""What must hold in a forkd home once its daemon is back after a crash, checked from outside the daemon.

Each check returns a list of violations (one sentence each, naming the file, child or object). The categories:

  snapshots  every snapshot is `ready` and its files hash to what its manifest says, or `failed`; none `writing`
             without a live writer, no manifest unreadable
  children   every recorded child is running and its agent answers (a dead one must have been reaped at start-up);
             every child the load claimed and did not kill still exists (a child lives until someone kills it)
  orphans    no QEMU process of this home without a live record; no cgroup of this home, network lease / namespace
             / veth of a child without a record; no tmpfs file that no snapshot owns; no child directory (sockets)
             without a record; nothing left in $FORKD_HOME/tmp; this home's tmpfs directory marked as its own;
             `forkd gc --dry-run --grace 0` finds nothing of this home (another home's tmpfs directory, network
             and the VMMs in it, which gc takes once that home is gone, are not)
  pools      every pool is back at its target (status.warm == spec.warm, Ready), or has every warm child its
             maxChildren leaves room for beside its claimed children (a claimed child lives until killed)
  audit      `forkd audit verify` says OK
  errors     no CLI command failed with exit 1 (an internal error, HTTP 500) while one daemon stayed up for its
             whole run (conflicts, not-found and unavailable, exits 2-6, are answers, not errors); a CLI layer
             build started in-process while no daemon answered succeeds though a daemon starts beside it
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from forkd.base.hashing import sha256_file
from forkd.base.owners import dead_under
from forkd.base.paths import MARKER, Layout
from forkd.base.procs import is_alive
from forkd.core.audit import verify as audit_verify
from forkd.core.runtime import Runtime
from forkd.sandbox import cgroups, netns
from forkd.sandbox.claims import CLAIMS
from forkd.sandbox.registry import RECORD
from forkd.store import chain
from forkd.store.snapshot import DISK, MEMORY, VMSTATE, CorruptManifest, Snapshot
from tests.chaos import recovery

REGISTRY_LOCK = ".lock"  # the registry's lock file (kept)
CATEGORIES = ("snapshots", "children", "orphans", "pools", "audit", "errors")


def home_qemu_pids(home: Path) -> list[int]:
    """QEMU processes whose command line names this home or its tmpfs directory (never found by name alone)."""
    layout = Layout(home)
    marks = [str(home).encode()] + ([str(layout.shm_dir).encode()] if layout.shm_dir else [])
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        joined = b" ".join(cmd)
        if state != "Z" and cmd and cmd[0].endswith(b"qemu-system-x86_64") and any(m in joined for m in marks):
            pids.append(int(d.name))
    return pids


def _verify_snapshot(store, snap: Snapshot) -> str | None:
    d = store.dir(snap.tag)
    try:
        store.get_ready(snap.tag)
        if snap.is_layer:
            if chain.diff_hash(d) != snap.diff_sha256:
                return "its diff pages do not hash to diff_sha256"
        elif chain.hash_image(d / MEMORY) != snap.memory_sha256:
            return f"{d / MEMORY} does not hash to memory_sha256"
        if sha256_file(d / VMSTATE) != snap.vmstate_sha256:
            return f"{d / VMSTATE} does not hash to vmstate_sha256"
        if snap.has_disk and sha256_file(d / DISK) != snap.disk_sha256:
            return f"{d / DISK} does not hash to disk_sha256"
    except Exception as exc:  # noqa: BLE001 - any failure to verify is the violation
        return f"does not verify: {type(exc).__name__}: {exc}"
    return None


def check_snapshots(rt: Runtime) -> list[str]:
    out = []
    for snap in rt.store.list():
        if isinstance(snap, CorruptManifest):
            out.append(f"unreadable manifest: {snap}")
        elif snap.status == "writing":
            if not (snap.writer_pid and is_alive(snap.writer_pid, snap.writer_started)):
                out.append(f"snapshot {snap.tag} is still 'writing' though its writer (pid {snap.writer_pid}) died")
        elif snap.status == "ready":
            why = _verify_snapshot(rt.store, snap)
            if why:
                out.append(f"snapshot {snap.tag} is ready but {why}")
        elif snap.status != "failed":
            out.append(f"snapshot {snap.tag} has status {snap.status!r}")
    return out


def check_children(rt: Runtime, claimed: set[str]) -> list[str]:
    out = []
    recs = {r.id: r for r in rt.registry.list()}
    for r in recs.values():
        status = r.status
        if status == "starting" and r.spawner_pid and is_alive(r.spawner_pid, r.spawner_started):
            if (age := time.time() - r.created_at) < recovery.SPAWN_BOUND_S:
                continue  # a spawn in progress (the daemon refilling a pool)
            out.append(f"child {r.id} (pool {r.pool}) has been starting for {age:.0f} s under its live spawner "
                       f"(pid {r.spawner_pid}): a spawn its own timeouts should have ended; its pool counts it")
            continue
        if status != "running":
            out.append(f"child {r.id} (pool {r.pool}) is {status} after recovery, not reaped: {r.error or ''}")
            continue
        try:
            if rt.ping(r.id).get("child_id") != r.id:
                out.append(f"child {r.id}: its agent answers with another id")
        except Exception as exc:  # noqa: BLE001 - not answering is the violation
            out.append(f"child {r.id} is recorded running but does not answer: {type(exc).__name__}: {exc}")
    for cid in sorted(claimed - set(recs)):
        out.append(f"claimed child {cid} is gone though nobody killed it (a child lives until someone kills it)")
    return out


def _orphan_kernel_objects(layout: Layout, recs: dict, seen: set[str]) -> list[str]:
    out = []
    home = os.path.realpath(layout.home)
    live_pids = {r.pid for r in recs.values() if r.alive}
    for pid in home_qemu_pids(layout.home):
        if pid not in live_pids:
            out.append(f"QEMU pid {pid} of this home has no live child record")
    for g in cgroups.home_groups(str(layout.home)):
        if g.name not in recs:
            out.append(f"cgroup {g} has no child record")
    for path, lease in netns.leases():
        if lease is not None and os.path.realpath(lease.home) == home and lease.child not in recs:
            out.append(f"network lease {path} ({lease.netns}, {lease.host_if}) has no child record")
    gone = seen - set(recs)
    for name in netns.list_netns():
        if netns.child_of(name) in gone:
            out.append(f"network namespace {name} of killed child outlived it")
    host_ifs = {netns.host_if_name(c): c for c in gone}
    for ifname in netns.host_links():
        if ifname in host_ifs:
            out.append(f"host veth {ifname} of killed child {host_ifs[ifname]} outlived it")
    return out


def _orphan_files(layout: Layout, snaps: list, recs: dict) -> list[str]:
    out = []
    owned = {f"{s.memory_sha256}.mem" for s in snaps if isinstance(s, Snapshot) and s.memory_sha256}
    shm = layout.shm_dir
    if shm is not None and shm.is_dir():
        for p in sorted(shm.iterdir()):
            if p.name in (MARKER, "flat"):
                continue
            out.append(f"tmpfs file {p} ({_size(p)}) belongs to no snapshot and no running build")
        with contextlib.suppress(FileNotFoundError):
            for p in sorted((shm / "flat").iterdir()):
                if p.name not in owned:
                    out.append(f"tmpfs flat image {p} ({_size(p)}) belongs to no snapshot")
    with contextlib.suppress(FileNotFoundError):
        for p in sorted(layout.children.iterdir()):
            if p.name in (REGISTRY_LOCK, CLAIMS):
                continue
            if p.name.startswith("."):
                out.append(f"temporary {p} left in the registry")
            elif p.name not in recs and not (p / RECORD).exists():
                out.append(f"child directory {p} (sockets, logs) has no record")
            else:
                out += [f"temporary {t} left beside a child record" for t in sorted(p.glob(".*.tmp-*"))]
    with contextlib.suppress(FileNotFoundError):
        for p in sorted(layout.tmp.iterdir()):
            out.append(f"temporary {p} left in $FORKD_HOME/tmp")
    for root in (layout.home, shm):  # owned temporaries (forkd.base.owners) whose maker is dead, anywhere
        if root is not None:
            out += [f"temporary {p} of a dead process left behind" for p in dead_under(root)]
    with contextlib.suppress(FileNotFoundError):
        for p in sorted(layout.snapshots.iterdir()):
            if p.name.startswith("."):
                out.append(f"temporary {p} left in the store")
    return out


def _size(p: Path) -> str:
    try:
        return f"{p.lstat().st_blocks * 512 >> 20} MiB"
    except OSError:
        return "gone"


def _tmpfs_marker(layout: Layout) -> list[str]:
    """This home's tmpfs directory, if there is one, names this home: gc removes it by that once the home is gone."""
    d = layout.shm_dir
    if d is None or not d.is_dir():
        return []
    try:
        said = (d / MARKER).read_text(errors="replace")
    except FileNotFoundError:
        said = None
    if said == f"{layout.home}\n":
        return []
    return [f"the marker {d / MARKER} of this home's tmpfs directory says {said!r}, not {str(layout.home)!r}: once "
            "the home is gone, gc could not tell the directory is stale"]


def check_orphans(rt: Runtime, seen: set[str]) -> list[str]:
    recs = {r.id: r for r in rt.registry.list()}
    out = _orphan_kernel_objects(rt.layout, recs, seen)
    out += _orphan_files(rt.layout, rt.store.list(), recs)
    out += _tmpfs_marker(rt.layout)
    rep = rt.gc(dry_run=True, grace=0.0)
    # gc's flat_dirs are the tmpfs directories of homes gone from this host: never this home's (it exists), but
    # another's (a test that deleted its home). This home's own directory is judged by its marker, above.
    found = {k: v for k, v in rep.items() if isinstance(v, list) and v and k not in ("adopted", "flat_dirs")}
    found = this_homes(found, others_network(rt.layout.home), lambda pid: holds_beneath(pid, rt.layout.home))
    if found:
        out.append(f"forkd gc --dry-run --grace 0 would still remove: {found}")
    return out


def this_homes(found: dict[str, list], others: set[str], holds: Callable[[int], bool | None]) -> dict[str, list]:
    """What of gc's dry-run report is this home's: gc also takes the network of homes that no longer exist and the
    processes in it (forkd.sandbox.gc), which is host-wide garbage, not this home's leftover. `others` names other
    homes' namespaces, veths and lease addresses; `holds(pid)` says whether a VMM holds a file beneath this home
    (None: it is gone, so nothing is left)."""
    kept = {}
    for key, items in found.items():
        if key == "processes":
            items = [pid for pid in items if holds(pid)]
        elif key in ("netns", "veths", "leases"):
            items = [name for name in items if name not in others]
        if items:
            kept[key] = items
    return kept


def others_network(home: Path) -> set[str]:
    """The namespaces, host veths and lease addresses of homes other than `home` (by lease, or by the home key a
    namespace's name carries)."""
    mine, names = cgroups.home_key(str(home)), set()
    for _path, lease in netns.leases():
        if lease is not None and os.path.realpath(lease.home) != os.path.realpath(home):
            names |= {lease.netns, lease.host_if, lease.addr}
    for name in netns.list_netns():
        owner, child = netns.parse_netns(name)
        if owner is not None and owner != mine:
            names |= {name, netns.host_if_name(child)}
    return names


def holds_beneath(pid: int, home: Path) -> bool | None:
    """Whether process `pid` holds a file open beneath `home` (a VMM holds its log in its child's directory); None
    when it is gone."""
    prefix = os.path.realpath(home) + "/"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
    return False


def check_pools(pools: list[dict], children: list | None = None,
                events: Callable[[str], list[dict]] | None = None) -> list[str]:
    """Every pool at its target, Ready; given the children's records, a pool whose maxChildren is taken by claimed
    (or stopping) children need only have what room is left (tests/chaos/recovery.py), and a violation names the
    pool's children and (given `events`) its last events."""
    out = []
    for p in pools:
        name, want = p["metadata"]["name"], p["spec"]["warm"]
        status = p.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        if status.get("warm") == want and ready:
            continue
        if children is not None and (can := recovery.attainable(p, children)) < want and \
                (status.get("warm") or 0) >= can:
            continue  # full: it refills once the claimed children are killed
        why = "; ".join(f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"[:300]
                        for c in status.get("conditions", []) if c.get("status") != "True")
        more = f" [{recovery.describe(p, children, events(name) if events else [])}]" if children is not None else ""
        out.append(f"pool {name}: warm {status.get('warm')} of target {want}, Ready={ready}"
                   + (f" ({why})" if why else "") + more)
    return out


def check_audit(home: Path) -> list[str]:
    v = audit_verify(home)
    return [] if v.ok else [f"audit log does not verify: {v}"]
