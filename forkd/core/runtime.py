"""The runtime core every front end calls: images, snapshots, children. Front ends parse and print only."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from forkd.base.atomic import write_json
from forkd.base.cancel import CancelToken
from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.paths import Layout
from forkd.base.settings import settings
from forkd.base.telemetry import spawned, timed
from forkd.core.branch import BranchResult, branch
from forkd.core.pipeline.branch import Conversions
from forkd.core.pipeline.compaction import CompactJob
from forkd.core.pipeline.layer import LayerJob
from forkd.core.pipeline.parent import ParentJob
from forkd.core.requests import Branch, Compaction, LayerBuild, ParentBuild, Spawn, egress_json, prime_of
from forkd.image.build import Image, build, default_image, stub_image
from forkd.sandbox import cgroups
from forkd.sandbox.child import ChildRecord, Children, Claim, Registry
from forkd.sandbox.supervisor import Supervisor
from forkd.store.snapshot import Snapshot
from forkd.store.store import SnapshotStore
from forkd.vmm.agent_client import AgentClient
from forkd.vmm.driver import Decision, Machine, VmmDriver
from forkd.vmm.drivers import make_driver

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class Runtime:
    def __init__(self, layout: Layout | None = None, driver: VmmDriver | None = None):
        self.layout = (layout or Layout.from_env()).ensure()
        self.store = SnapshotStore(self.layout, populate=partial(cgroups.populate_shared, str(self.layout.home)))
        self.registry = Registry(self.layout)
        self._driver = driver
        self.conversions = Conversions()  # background conversions of its wait=False branches (this process's)
        self.sweeps = 0  # passes its idle loop finished (forkd.core.sweeper), the metric forkd_sweeps_total
        self.handles = Children(self.registry, lambda: self.driver, self.layout.home)  # each running child's owner

    @property
    def overlay_templates(self) -> Path:
        """Fresh child overlays of disk-backed snapshots, made once per snapshot disk (the driver's `disks`)."""
        return self.layout.cache / "overlays"

    @property
    def driver(self) -> VmmDriver:
        if self._driver is None:
            self._driver = make_driver(self.overlay_templates)
        return self._driver

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.registry, self.driver)

    # -- images and accelerator ------------------------------------------------------------------
    def build_image(self, progress: Progress = _quiet, force: bool = False) -> tuple[Image, bool]:
        if not self.driver.boots_kernel:
            return stub_image(self.layout, self.driver.name)
        return build(self.layout, progress, force=force)

    def image(self, image_id: str | None = None) -> Image:
        if image_id is None:
            return default_image(self.layout)
        return Image.load(self.layout.images / image_id)

    def accelerator(self, image: Image, progress: Progress = _quiet, reprobe: bool = False) -> tuple[Decision, bool]:
        """KVM or TCG for this kernel, decided by a real boot probe and cached per kernel hash.

        Returns (decision, from_cache). FORKD_ACCEL=kvm|tcg overrides the probe."""
        forced = settings().accel  # kvm or tcg: the setting's type checks it
        if forced:
            return Decision(forced, "set by FORKD_ACCEL", 0.0), False
        cache_path = self.layout.accel_cache
        try:
            cache = json.loads(cache_path.read_text())
        except (OSError, ValueError):
            cache = {}
        key = image.kernel_sha256 if self.driver.name == "qemu" else f"{image.kernel_sha256}:{self.driver.name}"
        hit = cache.get(key)
        if hit and not reprobe:
            return Decision(hit["accel"], hit["reason"], hit.get("probe_seconds", 0.0)), True
        progress("probing KVM with a real guest boot (cached afterwards)")
        decision = self.driver.probe_accel(image.kernel, image.initrd)
        cache[key] = {"accel": decision.accel, "reason": decision.reason,
                      "probe_seconds": decision.probe_seconds, "probed_at": time.time()}
        write_json(cache_path, cache)
        return decision, False

    # -- snapshots ---------------------------------------------------------------------------------
    def snapshots(self) -> list:
        return self.store.list()

    def network_of(self, snap: Snapshot) -> str:
        """A snapshot's network mode: its own, or inherited from what it was built on (layers, compacted bases
        and branches carry the device set of the parent they descend from)."""
        seen: set[str] = set()
        cur: Snapshot | None = snap
        while cur is not None and cur.tag not in seen:
            if cur.network != "none":
                return cur.network
            seen.add(cur.tag)
            nxt = cur.parent_tag or cur.labels.get("forkd.dev/branch-source-snapshot")
            try:
                cur = self.store.get(nxt) if nxt else None
            except ForkdError:
                cur = None
        return "none"

    def machine_for(self, snap: Snapshot) -> Machine:
        image = self.image(snap.image_id)
        return Machine(kernel=image.kernel, initrd=image.initrd, memory_mib=snap.memory_mib, vcpus=snap.vcpus,
                       accel=snap.accel, network=self.network_of(snap),
                       disk=self.store.disk_path(snap.tag) if snap.has_disk else None)

    def create_snapshot(self, req: ParentBuild, progress: Progress = _quiet,
                        cancel: CancelToken | None = None) -> Snapshot:
        """Boot a parent, warm it up, pause it and write a ready snapshot (see forkd.core.pipeline.parent)."""
        return ParentJob(self, req, progress, cancel).execute()

    def snapshot_info(self, tag: str) -> dict:
        snap = self.store.get(tag)
        d = self.store.dir(tag)
        info = snap.to_json()
        info["path"] = str(d)
        try:
            chain_ = self.store.ancestors(tag)
            info["depth"] = len(chain_) - 1
            info["ancestors"] = [s.tag for s in reversed(chain_[:-1])]
            info["chain_ok"] = True
        except ForkdError as exc:
            info["depth"], info["ancestors"], info["chain_ok"], info["chain_error"] = None, [], False, exc.message
        info["dependents"] = self.store.dependents(tag)
        info["materialized"] = self.store.flat_path(snap).exists()
        info["children"] = [c.id for c in self.registry.list() if c.snapshot == tag and c.status == "running"]
        info["stored_bytes"] = sum(p.stat().st_blocks * 512 for p in d.iterdir() if p.is_file())
        info["logical_bytes"] = snap.memory_bytes + snap.vmstate_bytes
        return info

    def snapshot_diff(self, req: LayerBuild, progress: Progress = _quiet,
                      cancel: CancelToken | None = None) -> Snapshot:
        """Build `req.tag` as a sparse diff layer on `req.parent_tag` (see forkd.core.pipeline.layer)."""
        return LayerJob(self, req, progress, cancel).execute()

    def compact(self, req: Compaction, progress: Progress = _quiet,
                cancel: CancelToken | None = None) -> Snapshot:
        """Write the chain head `req.from_tag` as a base snapshot `req.to_tag` (forkd.core.pipeline.compaction)."""
        return CompactJob(self, req, progress, cancel).execute()

    def branch(self, req: Branch) -> BranchResult:
        """Snapshot a running child (see forkd.core.pipeline.branch)."""
        return branch(self, req)

    def rmi(self, tag: str, force: bool = False, cascade: bool = False) -> list[str]:
        """Delete a snapshot. Refused while children of it run, or while layers are built on it, unless
        `force` (children keep their mapping; dependents are left without their ancestor) or `cascade`
        (dependents are deleted too, deepest first). Returns what was deleted."""
        with self.registry.locked():
            dependents = self.store.dependents(tag)
            if dependents and not (cascade or force):
                raise Conflict(f"snapshot {tag!r} has dependent layers: {', '.join(dependents)}",
                               hint="delete them first, or pass --cascade (delete them too) or --force")
            doomed = [*reversed(dependents), tag] if cascade else [tag]
            running = [c.id for c in self.registry.list()
                       if c.snapshot in doomed and c.status in ("running", "starting")]
            if running and not force:
                raise Conflict(f"snapshot {tag!r} is used by {len(running)} running children: "
                               f"{', '.join(running[:8])}",
                               hint=f"kill them first ('forkd kill --tag {tag}') or pass --force "
                                    "(running children keep their memory mapping)")
            for t in doomed:
                self.store.remove(t)
            self.driver.disks.prune_templates(self.overlay_templates)
            return doomed

    # -- children ----------------------------------------------------------------------------------
    def fork(self, req: Spawn, progress: Progress = _quiet, claim: Claim | None = None) -> list[ChildRecord]:
        """Restore `req.n` children of `req.tag` in parallel; return when every one answered. All or nothing.

        `network`: None follows the snapshot (isolated parents have a NIC, so their children always get a network
        namespace each); "isolated" on a parent built without a NIC, or "none" on one with a NIC, is refused, and
        so is an egress other than none on a parent without a NIC.
        `memory_limit_mib` / `cpu_weight` go into each child's cgroup; a child that cannot be placed is not
        started unless `allow_unconstrained`. `claim`: the children are handed out from birth (a claim that
        forks on the spot): no pool ever counts them as idle."""
        tag, n, network = req.tag, req.n, req.network
        with self.registry.locked():
            snap = self.store.get_ready(tag)
        if network is not None and network != self.network_of(snap):
            if network == "isolated":
                raise InvalidInput(f"snapshot {tag!r} was built without a network device, so its children cannot "
                                   "have one", hint="build the parent with --network isolated "
                                                    "(ForkParent spec.network: isolated)")
            raise InvalidInput(f"snapshot {tag!r} has a network device: its children always run isolated, each in "
                               "its own network namespace", hint="fork it with network isolated (the default)")
        if req.egress != "none" and self.network_of(snap) != "isolated":
            raise InvalidInput(f"egress {egress_json(req.egress)!r}: snapshot {tag!r} was built without a network "
                               "device, so its children have no network to open", hint="fork a snapshot built with "
                               "--network isolated (ForkParent spec.network: isolated), or leave egress at none")
        machine = self.machine_for(snap)
        # checks every ancestor's manifest; builds the flat image only the first time (never re-hashes)
        memory, vmstate = self.store.materialize(tag), self.store.vmstate_path(tag)
        sup, prime = self.supervisor, prime_of(req.prime, settings().prime)
        done: list[ChildRecord] = []
        errors: list[BaseException] = []
        # restores are CPU-bound (QEMU start-up and TCG translation): more in flight than twice the cores
        # only makes each child slower without raising throughput (measured: 4 -> 13.5/s, 16 -> 12.2/s)
        with ThreadPoolExecutor(max_workers=min(n, 2 * (os.cpu_count() or 1))) as workers:
            futures = [workers.submit(sup.spawn, tag, machine, memory, vmstate, req.timeout, req.pool,
                                      memory_limit_mib=req.memory_limit_mib,
                                      allow_unconstrained=req.allow_unconstrained, cpu_weight=req.cpu_weight,
                                      egress=egress_json(req.egress), claim=claim, prime=prime,
                                      prime_is_default=bool(prime) and not req.prime)
                       for _ in range(n)]
            for fut in as_completed(futures):
                try:
                    rec, vm = fut.result()
                    self.driver.release(vm)
                    done.append(rec)
                    progress(f"{len(done)}/{n} children answering")
                except BaseException as exc:  # noqa: BLE001 - collected, reported below
                    errors.append(exc)
        if errors:
            for rec in done:
                sup.kill(rec)
            for rec in self.registry.list():
                if rec.state == "failed" and rec.snapshot == tag:
                    sup.kill(rec)
            first = errors[0]
            raise ForkdError(f"{len(errors)} of {n} children failed to start; none kept. First error: {first}",
                             hint=getattr(first, "hint", None)) from first
        spawned(done, req.pool, claim is not None)
        return sorted(done, key=lambda r: r.timings_ms.get("ready", 0))

    def claim_children(self, pool: str, n: int, ttl_seconds: int | None = None,
                       prefer_tag: str | None = None) -> list[ChildRecord]:
        """Mark up to `n` idle, running children of `pool` as claimed (those on `prefer_tag` first, oldest first)
        and return them. Atomic against other claimers and the reconciler's retirements (registry lock); the whole
        batch is one appended line of the registry's claims log."""
        with self.registry.locked():
            idle = [r for r in self.registry.list() if r.pool == pool and not r.claimed and r.status == "running"]
            idle.sort(key=lambda r: (r.snapshot != prefer_tag, r.created_at, r.id))
            return self.registry.claim(idle[:n], Claim.now(ttl_seconds))

    def unclaim(self, ids: list[str]) -> None:
        """Give claimed children back to their pool as idle (a claim that could not be completed)."""
        with self.registry.locked():
            self.registry.unclaim(ids)

    def retire(self, child_id: str, still: Callable[[ChildRecord], bool]) -> bool:
        """Stop a child the reconciler retires, if it still qualifies now (forkd.sandbox.child.ChildHandle.retire:
        checked under the registry lock, marked `stopping` before the lock is released). True if it was retired."""
        return self.handles.get(child_id).retire(still)

    def start_sweeper(self, stop: threading.Event, audit: Any = None) -> threading.Thread:
        """Start this node's idle loop (forkd.core.sweeper: lifetimes, branch snapshots, idle page-out and sleep)
        on a daemon thread, until `stop` is set."""
        from forkd.core import sweeper

        return sweeper.start(self, stop, audit)

    def recover(self) -> list[str]:
        """After a crash: mark snapshots whose writer died as failed, and resume children a dead process left
        paused (a branch interrupted between pause and resume; not those asleep, which their next request
        resumes: forkd.sandbox.child). Returns the failed snapshot tags."""
        failed = self.store.recover()
        for rec in self.registry.list():
            try:
                self.handles.of(rec).ensure_running()
            except (ForkdError, OSError) as exc:  # e.g. its QMP too slow to greet: one child must not stop recovery
                logging.getLogger("forkd.runtime").warning("child %s: could not check it is running after a crash "
                                                           "(%s: %s)", rec.id, type(exc).__name__, exc)
        return failed

    def children(self) -> list[ChildRecord]:
        return self.registry.list()

    def console(self, child_id: str, offset: int = 0) -> tuple[int, bytes]:
        """A child's console log from byte `offset` (forkd.sandbox.child.ChildHandle.console)."""
        return self.handles.get(child_id).console(offset)

    def child(self, child_id: str) -> ChildRecord:
        return self.registry.get(child_id)

    @contextmanager
    def agent(self, child_id: str, timeout: float = 10.0) -> Iterator[AgentClient]:
        """The one door of every request to a child's agent (forkd.sandbox.child.ChildHandle.request): it holds
        the child awake (resumed first if the idle loop put it to sleep, then its clock set) while the block runs."""
        with self.handles.get(child_id).request(timeout) as client:
            yield client

    def exec(self, child_id: str, argv: list[str], *, env: dict | None = None, cwd: str | None = None,
             stdin: str | None = None, timeout: float | None = None) -> dict:
        if not argv:
            raise InvalidInput("exec needs a command", hint="forkd exec ID -- CMD [ARGS...]")
        with self.agent(child_id) as a, timed("exec", kind="exec"):
            return a.exec(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout)

    def eval(self, child_id: str, code: str, timeout: float = 60.0) -> dict:
        with self.agent(child_id) as a, timed("exec", kind="eval"):
            return a.eval(code, timeout=timeout)

    def exec_code(self, child_id: str, code: str, timeout: float = 300.0) -> dict:
        with self.agent(child_id) as a, timed("exec", kind="exec_code"):
            return a.exec_code(code, timeout=timeout)

    def ping(self, child_id: str) -> dict:
        with self.agent(child_id) as a:
            return a.ping()

    def kill(self, ids: list[str] | None = None, all_: bool = False, tag: str | None = None) -> list[tuple[str, bool]]:
        """Stop children and drop their records: the given ids, all of them, or those of one snapshot. A child
        another operation is still creating (or stopping) is waited for first: nothing removes a child under
        its spawner."""
        if all_ or tag:
            recs = [r for r in self.registry.list() if all_ or r.snapshot == tag]
        else:
            if not ids:
                raise InvalidInput("name children to kill, or pass --all / --tag")
            recs = [self.registry.get(i) for i in ids]
        deadline = time.monotonic() + settings().kill_wait_seconds
        out, busy = [], []
        for r in recs:
            handle = self.handles.of(r)
            was_running = handle.kill(wait_until=deadline)  # None: another operation still owns it
            if was_running is None:
                busy.append(handle.rec)
            else:
                out.append((r.id, was_running))
        if busy:  # the others are killed; these belong to an operation that has not finished in time
            raise Conflict(f"{len(busy)} children are still being started or stopped by another process: "
                           + ", ".join(f"{r.id} ({r.status}, process {r.stopper_pid or r.spawner_pid})"
                                       for r in busy[:8]),
                           hint="try 'forkd kill' again once 'forkd ls' shows them running")
        return out

    def gc(self, dry_run: bool = False, grace: float | None = None) -> dict:
        """Adopt live recorded children; reap dead ones and every orphaned namespace, veth, tap, lease, cgroup,
        socket directory, staging memory file and VMM process (see forkd.sandbox.gc)."""
        from forkd.sandbox import gc as gc_

        kw = {} if grace is None else {"grace": grace}
        with self.registry.locked():
            report = gc_.collect(self.layout, dry_run=dry_run, **kw).to_json()
            pruned = self.driver.disks.prune_templates(self.overlay_templates, dry_run)
            report["overlay_templates"] = [str(p) for p in pruned]
            return report

    def memory(self, child_id: str) -> dict[str, int]:
        rec = self.registry.get(child_id)
        return self.supervisor.private_memory_kib(rec, self.store.flat_path(self.store.get(rec.snapshot)))

