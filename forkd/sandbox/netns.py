"""Per-child network namespaces (pyroute2 + nftables), so clones keep the parent's guest IP and MAC yet are
fenced off from the host and from each other.

    guest eth0 10.42.0.2/24 (MAC 52:54:00:12:34:56, the same in every clone)
      | virtio-net
    netns forkd-<child>:  tap0 10.42.0.1/24 (the guest's gateway)    veth0 10.200.X.Y/16, default via 10.200.0.1
                          nft table inet forkd: tap0 -> veth0 only as the child's egress allows (IPv4; IPv6
                          never); masquerade out of veth0; nothing new comes in, nothing reaches the namespace
      | veth pair
    host: fkh<child-hex> -- bridge forkd0 10.200.0.1/16 (port "isolated on": ports never talk to each other)
          nft table inet forkd_host: from forkd0 nothing reaches the host (INPUT) or is forwarded (FORWARD)
          unless a child's egress allows it (sets allow4 / internet4, keyed by the child's leased address);
          never IPv6, never another child; masquerade 10.200.0.0/16 leaving by any other interface.

The nftables tables and the host grants live in forkd.sandbox.firewall; the bridge's names and addresses, the
leases' directory and NetworkError in forkd.sandbox.netlayout.

Per-child addresses are leased with files under /run/forkd/leases/ (tmpfs: gone with the namespaces at reboot),
each written whole before it takes its name (link(2) of a finished file: a reader never sees half a lease). A lease
is taken before its namespace and veth exist and dropped after they are gone, and names its namespace, host veth and
FORKD_HOME: that is how `gc` tells its own leftovers from another home's live children. A namespace's name carries
its home too (forkd-<home key>-<child>, the key of the home's cgroups), so one found without a lease is still known
to be another home's and left to that home.

Namespace work runs in the calling thread after setns(2) (which moves only that thread): no helper processes,
safe with the thread pool that spawns children in parallel.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from forkd.base import nsthread
from forkd.base.errors import ForkdError
from forkd.base.locks import file_lock
from forkd.base.owners import owned_name, owner_of
from forkd.base.settings import settings
from forkd.sandbox.cgroups import home_key
from forkd.sandbox.firewall import Egress, ensure_host_table, grant, load_rules, netns_rules, revoke
from forkd.sandbox.netlayout import BRIDGE, BRIDGE_ADDR, BRIDGE_NET, BRIDGE_PREFIX, INNER_VETH, NetworkError, leases_dir
from forkd.vmm.driver import TAP_NAME

GUEST_GW = "10.42.0.1"
GUEST_ADDR = "10.42.0.2"
GUEST_PREFIX = 24
NETNS_PREFIX = "forkd-"
HOST_IF_PREFIX = "fkh"
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
MS_BIND, MS_REC, MS_SHARED, MNT_DETACH = 0x1000, 0x4000, 1 << 20, 2
TUNSETIFF, TUNSETPERSIST = 0x400454CA, 0x400454CB
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000

_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("forkd.netns")
_host_ready = threading.Lock()
_host_done = False
_dir_shared = False
_dir_warned = False


def _iproute():
    try:
        from pyroute2 import IPRoute
    except ImportError as exc:  # pragma: no cover - a dependency, installed by scripts/setup.sh
        raise NetworkError("pyroute2 is not installed", hint="pip install pyroute2 (scripts/setup.sh does)") from exc
    return IPRoute()


_TAGGED = re.compile(r"^(h[0-9a-f]{10})-(.+)$")  # forkd-<home key>-<child>; an older forkd's: forkd-<child>


def netns_name(child_id: str, home: str) -> str:
    """The child's namespace: forkd-<home key>-<child> (a home's key as its cgroups', forkd.sandbox.cgroups)."""
    return f"{NETNS_PREFIX}{home_key(home)}-{child_id}"


def parse_netns(name: str) -> tuple[str | None, str]:
    """(home key, child id) of a namespace named by netns_name; (None, child id) for an older forkd's name."""
    rest = name[len(NETNS_PREFIX):]
    m = _TAGGED.match(rest)
    return (m[1], m[2]) if m else (None, rest)


def child_of(name: str) -> str:
    return parse_netns(name)[1]


def host_if_name(child_id: str) -> str:
    """At most 15 characters (IFNAMSIZ): fkh + the child id without its leading 'c'."""
    return (HOST_IF_PREFIX + child_id.lstrip("c"))[:15]


@dataclass(frozen=True)
class ChildNet:
    netns: str
    host_if: str
    addr: str  # the namespace's own address on the bridge (what the guest is masqueraded to)
    home: str
    child: str
    created_at: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


# -- thread-local namespace switching ---------------------------------------------------------------------
@contextlib.contextmanager
def inside(name: str) -> Iterator[int]:
    """Run the body in network namespace `name` (this thread only); yields an fd of the original namespace."""
    if not (NETNS_DIR / name).exists():
        raise NetworkError(f"network namespace {name} does not exist")
    with nsthread.entered(str(NETNS_DIR / name)) as own:
        yield own


def exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def list_netns() -> list[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(NETNS_PREFIX))
    except FileNotFoundError:
        return []


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return None


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is `name` (compared by namespace inode)."""
    ino = netns_inode(name)
    if ino is None:
        return []
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}/ns/net").st_ino == ino:
                    out.append(int(d))
            except OSError:
                continue
    return out


# -- leases --------------------------------------------------------------------------------------------------
def _addr(index: int) -> str:
    return f"10.200.{index >> 8}.{index & 255}"


@contextlib.contextmanager
def _lease_writer(net: ChildNet) -> Iterator[Path]:
    """A finished lease file under an owned temporary name (forkd.base.owners: gc removes it once its maker is
    gone), for the caller to link(2) to the lease's name: taken whole or not at all."""
    leases_dir().mkdir(parents=True, exist_ok=True)
    os.chmod(settings().run_dir, 0o700)
    tmp = leases_dir() / owned_name(".lease")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(net.to_json(), f)
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def _take(tmp: Path, name: str) -> bool:
    """Give the finished lease `tmp` the name `name`, unless that name is taken (False)."""
    try:
        os.link(tmp, leases_dir() / name)
    except FileExistsError:
        return False
    return True


def _lease(net: ChildNet) -> ChildNet:
    start = secrets.randbelow(65000) + 2
    for k in range(65530):
        addr = _addr(2 + (start + k) % 65530)
        if (leases_dir() / addr).exists():
            continue
        leased = ChildNet(net.netns, net.host_if, addr, net.home, net.child, time.time())
        with _lease_writer(leased) as tmp:
            if not _take(tmp, addr):
                continue
        revoke(addr)  # grants a crashed owner of this address left behind are not this child's
        return leased
    raise NetworkError(f"no free address left in {BRIDGE_NET}")


def leases() -> list[tuple[Path, ChildNet | None]]:
    out: list[tuple[Path, ChildNet | None]] = []
    try:
        names = sorted(os.listdir(leases_dir()))
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".grants") or owner_of(n) is not None:  # an address's host grants: go with its lease
            continue  # (release / the next _lease); a lease being written (_lease_writer)
        p = leases_dir() / n
        try:
            raw = json.loads(p.read_text())
            out.append((p, ChildNet(**{k: raw[k] for k in ChildNet.__dataclass_fields__ if k in raw})))
        except (OSError, ValueError, TypeError):
            out.append((p, None))
    return out


# -- host side -------------------------------------------------------------------------------------------
def ensure_host() -> None:
    """The bridge forkd0 (10.200.0.1/16) and the host's nft table: created once, idempotent across processes."""
    global _host_done
    with _host_ready:
        if _host_done:
            return
        with _iproute() as ipr, _host_lock():
            if not ipr.link_lookup(ifname=BRIDGE):
                try:
                    ipr.link("add", ifname=BRIDGE, kind="bridge")
                except Exception as exc:  # noqa: BLE001 - pyroute2 raises NetlinkError; EEXIST is a race won
                    if getattr(exc, "code", None) != errno.EEXIST:
                        raise NetworkError(f"cannot create bridge {BRIDGE}: {exc}") from exc
            idx = ipr.link_lookup(ifname=BRIDGE)[0]
            have = {a.get("IFA_ADDRESS") for a in ipr.get_addr(index=idx)}
            if BRIDGE_ADDR not in have:
                ipr.addr("add", index=idx, address=BRIDGE_ADDR, prefixlen=BRIDGE_PREFIX)
            ipr.link("set", index=idx, state="up")
            ensure_host_table()
        _host_done = True


def _host_lock() -> contextlib.AbstractContextManager[None]:
    run_dir = settings().run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    return file_lock(run_dir / ".host.lock")


def _mounts_beneath(directory: Path) -> list[str]:
    """Mount points strictly below `directory` that its paths reach (mountinfo also lists mounts hidden by a later
    mount over their directory: those are another device's than the path resolves to)."""
    prefix, here = str(directory) + "/", os.stat(directory).st_dev
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            with contextlib.suppress(OSError):
                if point.startswith(prefix) and os.stat(point).st_dev != here:
                    out.append(point)
    return out


def ensure_shared_dir() -> None:
    """/run/netns a shared mount of its own before forkd mounts a namespace there, as `ip netns add` makes it.

    Where it is a plain directory, the first `ip netns add` run on the host afterwards bind-mounts it over itself,
    hiding every namespace mounted there before: their paths then open an empty file, and removing them (umount
    by path, unlink) fails, so each leaks until reboot. Made so while nothing is mounted beneath it yet (a
    namespace mounted beneath would be hidden by the bind in just that way): otherwise left as it is, with a
    warning, and tried again at the next namespace."""
    global _dir_shared, _dir_warned
    if _dir_shared:
        return
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    path = str(NETNS_DIR).encode()
    with _host_lock():
        if _libc.mount(b"none", path, None, MS_SHARED | MS_REC, None) != 0:
            e = ctypes.get_errno()
            if e != errno.EINVAL:  # EINVAL: not a mount point of its own
                raise NetworkError(f"making {NETNS_DIR} a shared mount: {os.strerror(e)}",
                                   hint="run as root (CAP_SYS_ADMIN), as network isolation needs")
            if below := _mounts_beneath(NETNS_DIR):
                if _dir_warned:
                    return
                _dir_warned = True
                log.warning("%s is not a mount point of its own and namespaces are mounted in it already (%s): an "
                            "`ip netns add` on this host would hide them; forkd makes it one once they are gone",
                            NETNS_DIR, ", ".join(below[:3]))
                return
            if (_libc.mount(path, path, None, MS_BIND | MS_REC, None) != 0
                    or _libc.mount(b"none", path, None, MS_SHARED | MS_REC, None) != 0):
                e = ctypes.get_errno()
                raise NetworkError(f"making {NETNS_DIR} a shared mount of its own: {os.strerror(e)}",
                                   hint="run as root (CAP_SYS_ADMIN), as network isolation needs")
    _dir_shared = True


@contextlib.contextmanager
def _new_netns(name: str) -> Iterator[int]:
    """Create namespace `name` and run the body inside it (this thread only; unshare(2) + a bind mount on
    /run/netns/<name>, as `ip netns add` does, without a helper process: ~1 ms). Yields an fd of the original
    namespace."""
    ensure_shared_dir()
    path = NETNS_DIR / name
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    except FileExistsError:
        raise NetworkError(f"network namespace {name} already exists") from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.unshare(CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            os.unlink(path)
            raise NetworkError(f"unshare(CLONE_NEWNET): {os.strerror(e)}")
        try:
            if _libc.mount(b"/proc/thread-self/ns/net", str(path).encode(), b"none", MS_BIND, None) != 0:
                e = ctypes.get_errno()
                raise NetworkError(f"bind-mounting the namespace on {path}: {os.strerror(e)}")
            yield own
        finally:
            nsthread.return_to(own)
    finally:
        os.close(own)


def _make_tap(name: str) -> None:
    """A persistent tap in the current thread's namespace; QEMU attaches to it by name (root, before -runas)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
        fcntl.ioctl(fd, TUNSETPERSIST, 1)
    finally:
        os.close(fd)


def create_empty(child_id: str, home: str) -> ChildNet:
    """An empty network namespace of the child's own, for a VMM without a NIC: a compromised VMM then reaches
    neither the host's loopback services nor its abstract unix sockets, nor any other VMM's. Only `lo`, down (the
    VMM has no capability to raise it). Leased under its own name before it exists (no address), so every home's
    gc knows whose it is; removed like an isolated child's (teardown)."""
    net = ChildNet(netns_name(child_id, home), "", "", home, child_id, time.time())
    with _lease_writer(net) as tmp:
        if not _take(tmp, net.netns):
            raise NetworkError(f"network namespace {net.netns} is leased already")
    try:
        with _new_netns(net.netns):
            pass
    except BaseException:
        teardown(net)
        raise
    return net


def setup(child_id: str, home: str, egress: Egress = "none") -> tuple[ChildNet, dict[str, float]]:
    """Create the child's namespace, tap, veth pair, NAT and egress rules (namespace and host); returns its
    description and step timings (ms). On failure everything made so far is removed again."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    ensure_host()
    timings["host"] = (time.perf_counter() - t0) * 1000.0
    net = _lease(ChildNet(netns_name(child_id, home), host_if_name(child_id), "", home, child_id))
    try:
        t1 = time.perf_counter()
        with _new_netns(net.netns) as host_fd, _iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            _make_tap(TAP_NAME)
            tap = ipr.link_lookup(ifname=TAP_NAME)[0]
            ipr.addr("add", index=tap, address=GUEST_GW, prefixlen=GUEST_PREFIX)
            ipr.link("set", index=tap, state="up")
            # the peer is created straight in the host namespace (moving a link afterwards costs ~17 ms)
            ipr.link("add", ifname=INNER_VETH, kind="veth", peer={"ifname": net.host_if, "net_ns_fd": host_fd})
            veth = ipr.link_lookup(ifname=INNER_VETH)[0]
            ipr.addr("add", index=veth, address=net.addr, prefixlen=BRIDGE_PREFIX)
            ipr.link("set", index=veth, state="up")
            ipr.route("add", dst="default", gateway=BRIDGE_ADDR)
            with open("/proc/sys/net/ipv4/ip_forward", "w") as f:  # per namespace: this thread's
                f.write("1")
            load_rules(netns_rules(egress))  # forked from this thread: runs in the child's namespace
        timings["inside"] = (time.perf_counter() - t1) * 1000.0
        t3 = time.perf_counter()
        with _iproute() as ipr:
            idx = ipr.link_lookup(ifname=net.host_if)[0]
            br = ipr.link_lookup(ifname=BRIDGE)[0]
            ipr.link("set", index=idx, master=br)
            ipr.brport("set", index=idx, isolated=1)
            ipr.link("set", index=idx, state="up")
        grant(net.addr, egress)
        timings["host_port"] = (time.perf_counter() - t3) * 1000.0
    except BaseException as exc:
        try:
            teardown(net)
        except ForkdError as cleanup:
            exc.add_note(f"cleaning up after it also failed: {cleanup.message}")
        if isinstance(exc, ForkdError):
            raise
        raise NetworkError(f"setting up network namespace {net.netns} failed: {exc}") from exc
    timings["total"] = (time.perf_counter() - t0) * 1000.0
    return net, timings


def delete_link(name: str) -> bool:
    """Delete a host interface by name (a veth: its peer goes too). True if it existed, False if it is gone
    (meanwhile too); any other netlink failure raises NetworkError naming the interface (never "nothing there")."""
    try:
        with _iproute() as ipr:
            found = ipr.link_lookup(ifname=name)
            if not found:
                return False
            ipr.link("del", index=found[0])
            return True
    except ForkdError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyroute2's NetlinkError and socket errors
        if getattr(exc, "code", None) == errno.ENODEV:  # deleted between the lookup and the delete
            return False
        raise NetworkError(f"cannot delete host interface {name}: {exc}",
                           hint="run as root (CAP_NET_ADMIN); `forkd gc` retries it") from exc


def remove_netns(name: str) -> bool:
    if not exists(name):
        return False
    path = str(NETNS_DIR / name).encode()
    _libc.umount2(path, MNT_DETACH)  # the namespace itself goes once no process or fd holds it
    try:
        os.unlink(NETNS_DIR / name)
    except FileNotFoundError:
        pass
    except OSError as exc:  # EBUSY: still a mount point, one this path no longer reaches (ensure_shared_dir)
        log.warning("network namespace %s cannot be removed (%s): %s was mounted over after it was made, hiding "
                    "it; it stays until the host reboots", name, exc.strerror, NETNS_DIR)
    return True


def release(addr: str, netns: str | None = None) -> None:
    """Take back the host grants of `addr` and drop its lease (only if it still names `netns`, when given)."""
    p = leases_dir() / addr
    if netns is not None:
        try:
            if json.loads(p.read_text()).get("netns") != netns:
                return
        except (OSError, ValueError):
            pass
    revoke(addr)
    with contextlib.suppress(FileNotFoundError):
        p.unlink()


def teardown(net: ChildNet) -> None:
    """Remove the host veth (and with it the pair), the namespace (its tap goes with it) and the lease. Call after
    the child's VMM is gone: a namespace lives on while a process is in it."""
    try:
        if net.host_if:
            delete_link(net.host_if)
    finally:  # the namespace and the lease go even when the link could not: its error is raised after
        remove_netns(net.netns)
        if net.addr:
            release(net.addr, net.netns)
        else:  # an empty namespace's lease, under its own name (create_empty)
            with contextlib.suppress(FileNotFoundError):
                (leases_dir() / net.netns).unlink()


def host_links() -> list[str]:
    """Host interfaces that follow our naming (fkh...); NetworkError when they cannot be listed (never [] then, so
    gc and doctor do not report "no leftovers" on a failure)."""
    try:
        with _iproute() as ipr:
            return sorted(n for link in ipr.link("dump") if (n := link.get("ifname") or "").startswith(HOST_IF_PREFIX))
    except ForkdError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyroute2's NetlinkError and socket errors
        raise NetworkError(f"cannot list the host's network interfaces: {exc}",
                           hint="check that this process may open a netlink socket (file descriptors left?)") from exc
