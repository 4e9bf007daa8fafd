"""The one process supervisor: restores children through a VMM driver, records them on disk at once,
checks them and stops them (by recorded pid + start time, never by name)."""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from forkd.base import idrange
from forkd.base.errors import ForkdError, ProtocolViolation
from forkd.base.procs import kill_and_wait, start_time
from forkd.base.settings import settings
from forkd.sandbox import cgroups, netns
from forkd.sandbox.firewall import Egress
from forkd.sandbox.registry import ChildRecord, Claim, Registry
from forkd.vmm.agent_client import AgentTimeout
from forkd.vmm.driver import Machine, RunFiles, Vm, VmmDriver

log = logging.getLogger(__name__)

ENTROPY_BYTES = 64
DEFAULT_PRIME_TIMEOUT = 300.0  # the default prime is a first exec done early: it gets an exec's default timeout


@contextmanager
def attached(driver: VmmDriver, rec: ChildRecord, timeout: float = 5.0) -> Iterator[Vm]:
    """The child's VMM, its control channel connected for the block and released after (the VM runs on)."""
    vm = driver.attach(RunFiles(Path(rec.dir)), rec.pid, rec.started)
    try:
        driver.connect(vm, timeout=timeout)
        yield vm
    finally:
        driver.release(vm)


class Supervisor:
    def __init__(self, registry: Registry, driver: VmmDriver):
        self.registry = registry
        self.driver = driver

    def spawn(self, snapshot: str, machine: Machine, memory: Path, vmstate: Path,
              timeout: float = 30.0, pool: str | None = None, memory_limit_mib: int | None = None,
              allow_unconstrained: bool = False, cpu_weight: int = cgroups.DEFAULT_CPU_WEIGHT,
              egress: Egress = "none", claim: Claim | None = None,
              prime: tuple[str, ...] = (), prime_is_default: bool = False) -> tuple[ChildRecord, Vm]:
        """Restore one child, reseed it, and return once its agent answered. Recorded before it runs.

        Isolation: `machine.network == "isolated"` runs the VMM in its own network namespace (forkd.sandbox.netns);
        the VMM is placed in its own cgroup (memory limit, CPU weight) before the guest runs, and a VMM that cannot
        be placed is killed and the spawn fails (fail closed) unless `allow_unconstrained`. Every namespace and
        group is written into the record before it is made, so `gc` can find them after any crash. Privileges:
        under FORKD_VMM_RUNAS=per-child (the default) the VMM drops to a uid:gid of its own (runas_identity, kept
        in the record) with no capabilities once its files, sockets and tap are open (not yet with a disk:
        the driver's may_drop). `claim`: the child is handed out from birth (its first record says so), so a
        pool never counts it as idle. `prime`: shell commands run once after the reseed, while the child is still
        `starting` (forkd.core.requests.PRIME_DOC); one that exits non-zero fails the spawn, unless
        `prime_is_default` (FORKD_PRIME's `true`, which a guest without /bin/sh cannot run): then the child answers
        unprimed. The default prime has at least DEFAULT_PRIME_TIMEOUT: on a loaded TCG host a child's first exec
        can outlast a short spawn timeout, and without the prime that exec would have had as long."""
        t0 = time.perf_counter()
        home = str(self.registry.layout.home)
        hier = cgroups.detect()
        rec = self._record(snapshot, machine, pool, memory_limit_mib, home, hier, self.driver.may_drop(machine),
                           claim)
        group: cgroups.ChildCgroup | None = None
        net: netns.ChildNet | None = None
        setup_ms: dict[str, float] = {}

        def on_start(vm: Vm) -> None:  # persist the pid, then fence it in, before the child runs anything
            nonlocal rec
            rec = self.registry.save(rec.with_(pid=vm.pid, started=vm.started))
            if group is not None:
                t = time.perf_counter()
                group.place(vm.pid)  # raises: the driver stops the VMM, the spawn fails (fail closed)
                setup_ms["cgroup_place"] = (time.perf_counter() - t) * 1000.0

        try:
            group, rec = self._constrain(rec, home, hier, memory_limit_mib, cpu_weight, allow_unconstrained, setup_ms)
            if rec.netns is not None and machine.network != "none":
                net, net_ms = netns.setup(rec.id, home, egress)
                setup_ms.update({f"net_{k}": v for k, v in net_ms.items()})
                rec = self.registry.save(rec.with_(net_addr=net.addr, egress=egress))
            elif rec.netns is not None:
                t = time.perf_counter()
                net = netns.create_empty(rec.id, home)
                setup_ms["net_empty"] = (time.perf_counter() - t) * 1000.0
            vm = self.driver.restore(machine, memory, vmstate, RunFiles(Path(rec.dir)), timeout=timeout,
                                     on_start=on_start, netns=rec.netns, runas=rec.runas)
            t_restored = time.perf_counter()
            self._reseed(vm, rec, timeout)
            if prime:
                t = time.perf_counter()
                self._prime(vm, rec, prime, max(timeout, DEFAULT_PRIME_TIMEOUT) if prime_is_default else timeout,
                            fatal=not prime_is_default)
                setup_ms["prime"] = (time.perf_counter() - t) * 1000.0
            return self._running(rec, vm, setup_ms, t0, t_restored), vm  # its record failing to say so fails it
        except BaseException as exc:
            self._abandon(rec, net, group, exc)
            raise

    def _record(self, snapshot: str, machine: Machine, pool: str | None, memory_limit_mib: int | None, home: str,
                hier: cgroups.Hierarchy | None, runas: bool, claim: Claim | None = None) -> ChildRecord:
        """A new child's first record, saved before any of its namespace, group or VMM exists."""
        cid = self.registry.new_id()
        planned_cg = [str(b / cid) for b in hier.base(home)] if hier is not None else None
        rec = self.registry.save(ChildRecord(
            id=cid, snapshot=snapshot, created_at=time.time(), dir="", memory_mib=machine.memory_mib,
            vcpus=machine.vcpus, accel=machine.accel, driver=self.driver.name, pool=pool,
            spawner_pid=os.getpid(), spawner_started=start_time(os.getpid()), network=machine.network,
            netns=netns.netns_name(cid, home) if machine.network != "none" or settings().vmm_jail else None,
            cgroup=planned_cg,
            memory_limit_mib=memory_limit_mib, runas=runas_identity(cid) if runas else None,
            claimed_at=claim.at if claim else None, expires_at=claim.expires_at if claim else None,
            expires_boot=claim.expires_boot if claim else None))
        return rec.with_(dir=str(self.registry.path(rec.id)))

    def _constrain(self, rec: ChildRecord, home: str, hier: cgroups.Hierarchy | None, memory_limit_mib: int | None,
                   cpu_weight: int, allow_unconstrained: bool,
                   setup_ms: dict[str, float]) -> tuple[cgroups.ChildCgroup | None, ChildRecord]:
        """The child's cgroup, or None (and a record saying so) where none can be made and that is allowed."""
        t = time.perf_counter()
        group = None
        try:
            group = cgroups.create(rec.id, home, memory_limit_mib, cpu_weight)
        except cgroups.CgroupError as exc:
            if not (allow_unconstrained or (memory_limit_mib is None and hier is None)):
                raise cgroups.CgroupError(
                    f"child {rec.id} cannot be constrained, so it is not started: {exc.message}",
                    hint="fix the cgroup hierarchy (forkd doctor), or allow unconstrained children explicitly "
                         "(--allow-unconstrained / allow_unconstrained=True)") from exc
            rec = self.registry.save(rec.with_(cgroup=None, unconstrained=True))
        setup_ms["cgroup"] = (time.perf_counter() - t) * 1000.0
        return group, rec

    @staticmethod
    def _reseed(vm: Vm, rec: ChildRecord, timeout: float) -> None:
        """Tell the restored guest it is a new child: fresh entropy, its id as hostname, the current time."""
        vm.agent.call("forked", {"entropy": base64.b64encode(os.urandom(ENTROPY_BYTES)).decode(),
                                 "child_id": rec.id, "hostname": rec.id, "time": time.time()},
                      timeout=timeout)

    @staticmethod
    def _prime(vm: Vm, rec: ChildRecord, prime: tuple[str, ...], timeout: float, fatal: bool = True) -> None:
        """Run the spawn's prime commands in the new child, each within `timeout`; the first that fails fails it
        (`fatal`), or ends the priming with a log line (a guest that breaks the protocol or does not answer fails
        it either way)."""
        for cmd in prime:
            try:
                vm.agent.run_shell(cmd, timeout, what=f"child {rec.id}: prime command",
                                   hint="fix the command (ForkPool spec.child.prime, forkd fork --prime): it runs "
                                        "in every new child before the child counts as ready")
            except (ProtocolViolation, AgentTimeout):
                raise
            except ForkdError as exc:
                if fatal:
                    raise
                log.info("%s; the child answers unprimed (FORKD_PRIME=0 skips the default prime)", exc.message)
                return

    def _abandon(self, rec: ChildRecord, net: netns.ChildNet | None, group: cgroups.ChildCgroup | None,
                 exc: BaseException) -> None:
        """Undo a spawn that failed: its VMM, namespace and group go; its record stays, failed, with the error.

        Whatever fails on the way is added to `exc` as a note, and the record is never left `starting`: a
        starting child belongs to its spawner while that process lives (nobody else may stop, reap or retire it),
        and its pool counts it, so one left behind by a live daemon blocked that pool's refill until the daemon
        died. A record that cannot be written `failed` (a full $FORKD_HOME) is removed instead (a rename);
        whatever of its namespace or group is left then has no record, and gc removes it."""
        steps = [("stopping its VMM", lambda: kill_and_wait(rec.pid, rec.started) if rec.pid else None),
                 ("removing its network namespace", lambda: netns.teardown(net) if net is not None else None),
                 ("removing its cgroup", lambda: group.remove() if group is not None else None)]
        for what, step in steps:
            try:
                step()
            except Exception as cleanup:  # noqa: BLE001 - the spawn's own error is the one raised
                exc.add_note(f"child {rec.id}: {what} after the failed spawn failed too: {cleanup}")
        try:
            self.registry.save(rec.with_(state="failed", error=str(exc), pid=None))
        except OSError as cannot:
            exc.add_note(f"child {rec.id}: its record could not say it failed ({cannot}): removed instead")
            self.registry.remove(rec.id)

    def _running(self, rec: ChildRecord, vm: Vm, setup_ms: dict[str, float], t0: float,
                 t_restored: float) -> ChildRecord:
        """The record of a child whose agent answered: running, with the timings of each phase."""
        t_ready = time.perf_counter()
        timings = dict(vm.timings_ms)
        timings.update(setup_ms)
        timings["restore"] = (t_restored - t0) * 1000.0
        timings["forked"] = (t_ready - t_restored) * 1000.0
        timings["ready"] = (t_ready - t0) * 1000.0
        return self.registry.save(rec.with_(state="running", timings_ms=timings))

    def ensure_running(self, rec: ChildRecord) -> bool:
        """Resume a child whose VMM was left paused (e.g. a branch whose process died between pause and resume).
        Returns True if it had to be resumed."""
        if rec.status != "running":
            return False
        with attached(self.driver, rec) as vm:
            return self.driver.ensure_running(vm)

    def kill(self, rec: ChildRecord) -> bool:
        """Stop the child's VMM if it is still ours, remove its namespace and cgroup, drop its record and files.
        True if it was running."""
        was_running = False
        if rec.pid is not None:
            was_running = kill_and_wait(rec.pid, rec.started)
        release_isolation(rec)
        self.registry.remove(rec.id)
        return was_running

    def quarantine(self, rec: ChildRecord, exc: BaseException) -> None:
        """A child whose guest broke the agent protocol: stop its VMM, release its isolation, and keep its record
        as `failed` with the reason (`ls` shows it; `forkd kill` removes it; a pool replaces it).

        Recorded `failed` first, its pid kept, so no reader sees a running child whose VMM is gone (`dead`) while
        the VMM is killed; a process that dies before the kill leaves a failed record whose VMM `forkd kill` (or
        the pool retiring it) still stops."""
        failed = rec.with_(state="failed", error=f"misbehaved (agent protocol): {exc}")
        self.registry.save(failed)
        if rec.pid is not None:
            kill_and_wait(rec.pid, rec.started)
        release_isolation(rec)
        self.registry.save(failed.with_(pid=None))

    def private_memory_kib(self, rec: ChildRecord, memory: Path) -> dict[str, int]:
        """Guest RAM this child copied (Private_Dirty of the memory-file mapping) and the VMM's other Pss."""
        if rec.pid is None or start_time(rec.pid) != rec.started:
            raise ForkdError(f"child {rec.id} is not running")
        return smaps_split(rec.pid, os.path.realpath(memory))


def runas_identity(child_id: str) -> str:
    """A uid:gid of its own for a child's VMM (no passwd entry needed: QEMU 7.2's -runas takes uid:gid), so one
    compromised VMM cannot signal or ptrace a sibling: from the lower half of the VMM range (forkd.base.idrange),
    refused when the host hands that range out as subordinate ids. Two live children may share one (2^28 ids by
    default: rare, and only weakens isolation between those two)."""
    n = idrange.child_uid(child_id, *idrange.vmm_range())
    return f"{n}:{n}"


# How long the cgroup of a killed VMM is waited for: a VMM whose memory is being swapped in (a loaded host) can take
# many seconds to exit after SIGKILL, and its group cannot be removed before; once its record is gone nothing but
# `forkd gc` would remove it.
DYING_VMM_WAIT = 60.0


def release_isolation(rec: ChildRecord) -> None:
    """Remove what a (dead) child's isolation left behind: its namespace, veth, tap, lease and cgroup."""
    if rec.netns:
        host_if = netns.host_if_name(rec.id) if rec.network != "none" else ""  # an empty namespace has no link
        netns.teardown(netns.ChildNet(rec.netns, host_if, rec.net_addr or "", "", rec.id))
    g = cgroups.from_record(rec.cgroup)
    if g is not None:
        for pid in g.pids():  # only a process we placed can be in it; its record is this one
            if rec.pid == pid:
                kill_and_wait(pid, rec.started)
        if not g.remove(timeout=DYING_VMM_WAIT):
            log.warning("child %s: its cgroup %s still holds a process %.0f s after its VMM was killed; "
                        "'forkd gc' removes it once it is empty", rec.id, ", ".join(g.paths), DYING_VMM_WAIT)


def smaps_split(pid: int, memory_path: str) -> dict[str, int]:
    """KiB of a VMM's memory from /proc/PID/smaps. Of the guest RAM mapping (the snapshot's memory file, mapped
    private): guest_rss (pages mapped), guest_private (Private_Dirty: pages no other process maps, which counts the
    pages this child copied on write and also the file's pages only this child has read, as a tmpfs page is dirty)
    and guest_copied (Anonymous: only the pages this child wrote, each a copy of its own). vmm_pss: the Pss of the
    VMM's other mappings."""
    guest_private = guest_rss = guest_copied = other_pss = 0
    current_is_guest = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if not first.endswith(":"):  # a mapping header line: "addr perms offset dev inode path"
                parts = line.split()
                current_is_guest = len(parts) >= 6 and parts[5] == memory_path
                continue
            val = line.split()
            if first == "Private_Dirty:" and current_is_guest:
                guest_private += int(val[1])
            elif first == "Rss:" and current_is_guest:
                guest_rss += int(val[1])
            elif first == "Anonymous:" and current_is_guest:
                guest_copied += int(val[1])
            elif first == "Pss:" and not current_is_guest:
                other_pss += int(val[1])
    return {"guest_private_kib": guest_private, "guest_rss_kib": guest_rss, "guest_copied_kib": guest_copied,
            "vmm_pss_kib": other_pss}
