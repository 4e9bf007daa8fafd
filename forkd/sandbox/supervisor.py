"""The one process supervisor: restores children through a VMM driver, records them on disk at once,
checks them and stops them (by recorded pid + start time, never by name)."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.procs import kill_and_wait, start_time
from forkd.sandbox.registry import ChildRecord, Registry
from forkd.vmm.agent_client import AgentClient
from forkd.vmm.driver import Machine, RunFiles, Vm, VmmDriver

ENTROPY_BYTES = 64


class Supervisor:
    def __init__(self, registry: Registry, driver: VmmDriver):
        self.registry = registry
        self.driver = driver

    def spawn(self, snapshot: str, machine: Machine, memory: Path, vmstate: Path,
              timeout: float = 30.0, pool: str | None = None) -> tuple[ChildRecord, Vm]:
        """Restore one child, reseed it, and return once its agent answered. Recorded before it runs."""
        t0 = time.perf_counter()
        rec = self.registry.save(ChildRecord(
            id=self.registry.new_id(), snapshot=snapshot, created_at=time.time(), dir="", memory_mib=machine.memory_mib,
            vcpus=machine.vcpus, accel=machine.accel, driver=self.driver.name, pool=pool,
            spawner_pid=os.getpid(), spawner_started=start_time(os.getpid())))
        rec = rec.with_(dir=str(self.registry.path(rec.id)))

        def on_start(vm: Vm) -> None:  # persist the pid before the child runs anything
            nonlocal rec
            rec = self.registry.save(rec.with_(pid=vm.pid, started=vm.started))

        try:
            vm = self.driver.restore(machine, memory, vmstate, RunFiles(Path(rec.dir)), timeout=timeout,
                                     on_start=on_start)
            t_restored = time.perf_counter()
            vm.agent.call("forked", {"entropy": base64.b64encode(os.urandom(ENTROPY_BYTES)).decode(),
                                     "child_id": rec.id, "hostname": rec.id, "time": time.time()},
                          timeout=timeout)
        except BaseException as exc:
            if rec.pid:
                kill_and_wait(rec.pid, rec.started)
            self.registry.save(rec.with_(state="failed", error=str(exc), pid=None))
            raise
        t_ready = time.perf_counter()
        timings = dict(vm.timings_ms)
        timings["restore"] = (t_restored - t0) * 1000.0
        timings["forked"] = (t_ready - t_restored) * 1000.0
        timings["ready"] = (t_ready - t0) * 1000.0
        rec = self.registry.save(rec.with_(state="running", timings_ms=timings))
        return rec, vm

    def connect(self, rec: ChildRecord, timeout: float = 10.0) -> AgentClient:
        if rec.status != "running":
            raise ForkdError(f"child {rec.id} is {rec.status}",
                             hint=f"remove it with 'forkd kill {rec.id}' and fork a new one")
        return AgentClient(rec.agent_socket, connect_timeout=timeout)

    def kill(self, rec: ChildRecord) -> bool:
        """Stop the child's VMM if it is still ours and drop its record and files. True if it was running."""
        was_running = False
        if rec.pid is not None:
            was_running = kill_and_wait(rec.pid, rec.started)
        self.registry.remove(rec.id)
        return was_running

    def private_memory_kib(self, rec: ChildRecord, memory: Path) -> dict[str, int]:
        """Guest RAM this child copied (Private_Dirty of the memory-file mapping) and the VMM's other Pss."""
        if rec.pid is None or start_time(rec.pid) != rec.started:
            raise ForkdError(f"child {rec.id} is not running")
        return smaps_split(rec.pid, os.path.realpath(memory))


def smaps_split(pid: int, memory_path: str) -> dict[str, int]:
    guest_private = guest_rss = other_pss = 0
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
            elif first == "Pss:" and not current_is_guest:
                other_pss += int(val[1])
    return {"guest_private_kib": guest_private, "guest_rss_kib": guest_rss, "vmm_pss_kib": other_pss}
