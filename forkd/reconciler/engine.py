"""The executor and the loop: plan, perform the actions through the core, record events, failures (with
back-off) and statuses; again on every change and on an interval.

Slow actions (building a snapshot, spawning children) run on worker threads and are tracked as in flight, so a
slow or broken object never stalls the others; quick ones (retire a child, delete a snapshot) run inline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from forkd.base.errors import first_line
from forkd.core.requests import Branch, Compaction, LayerBuild, ParentBuild, Spawn
from forkd.reconciler import observe
from forkd.reconciler.actions import (
    Action,
    BuildBranch,
    BuildLayer,
    BuildParent,
    CompactSnapshot,
    DeleteSnapshot,
    RetireChild,
    SpawnChildren,
)
from forkd.reconciler.objects import ObjectStore
from forkd.reconciler.plan import backoff_seconds, plan
from forkd.reconciler.state import Failure
from forkd.reconciler.status import compute_status

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

log = logging.getLogger("forkd.reconciler")
SLOW = (BuildParent, BuildLayer, BuildBranch, CompactSnapshot, SpawnChildren)
PERMANENT_REASONS = {"SourceNotFound", "NotImplemented", "SandboxNotFound"}


def _target(action: Action) -> tuple[str, str] | None:
    if isinstance(action, BuildParent):
        return "ForkParent", action.parent
    if isinstance(action, BuildLayer):
        return "ForkLayer", action.layer
    if isinstance(action, BuildBranch):
        return "ForkBranch", action.branch
    if isinstance(action, (SpawnChildren, RetireChild, CompactSnapshot)) and action.pool:
        return "ForkPool", action.pool
    return None


class Reconciler:
    def __init__(self, rt: Runtime, objects: ObjectStore | None = None, workers: int = 3,
                 on_action: Callable[[Action, bool, str, float], None] | None = None):
        self.rt = rt
        self.on_action = on_action  # called after every action with (action, ok, message, ms), e.g. the audit log
        self.objects = objects or ObjectStore(rt.layout)
        self.failures: dict[str, Failure] = {}
        self.in_flight: dict[str, Future] = {}
        self.spawn_ms: dict[str, deque[float]] = {}
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="forkd-action")

    # -- one pass ----------------------------------------------------------------------------------
    def step(self) -> list[Action]:
        """Plan against the world as it is now, start what is not already running, update statuses."""
        with self._lock:
            self._reap_finished()
            desired = observe.desired(self.objects)
            actual = self._observe()
            actions = plan(desired, actual)
            for action in actions:
                if action.key in self.in_flight:
                    continue
                if isinstance(action, SLOW):
                    self.in_flight[action.key] = self._workers.submit(self._run, action)
                else:
                    self._run(action)
            self._write_statuses(desired)
            return actions

    def _observe(self):
        p50s = tuple((pool, sorted(v)[len(v) // 2]) for pool, v in sorted(self.spawn_ms.items()) if v)
        return observe.actual(self.rt, tuple(self.failures.values()), frozenset(self.in_flight), p50s)

    def _reap_finished(self) -> None:
        for key, fut in list(self.in_flight.items()):
            if fut.done():
                del self.in_flight[key]

    def _write_statuses(self, desired) -> None:
        actual = self._observe()
        previous = {f"{st.obj.kind}/{st.obj.metadata.name}": st.obj.status for st in self.objects.list()}
        for key, status in compute_status(desired, actual, previous).items():
            kind, name = key.split("/", 1)
            if kind == "ForkPool" and name in self.spawn_ms and self.spawn_ms[name]:
                samples = sorted(self.spawn_ms[name])
                status = status.model_copy(update={"spawnP50Ms": round(samples[len(samples) // 2], 1)})
            self.objects.set_status(kind, name, status)

    # -- executor ----------------------------------------------------------------------------------
    def _run(self, action: Action) -> None:
        target = _target(action)
        t0 = time.perf_counter()
        ok, message = False, ""
        try:
            message = self._execute(action)
            ok = True
        except Exception as exc:  # noqa: BLE001 - any failure is recorded, backed off and shown in status
            message = first_line(exc)
            attempts = self.failures[action.key].attempts + 1 if action.key in self.failures else 1
            delay = backoff_seconds(attempts)
            self.failures[action.key] = Failure(*action.key.split("/", 1), message=message, attempts=attempts,
                                                retry_at=time.time() + delay)
            log.warning("%s failed (attempt %d, retry in %.0fs): %s", action.key, attempts, delay, message)
            if target:
                self.objects.event(*target, "Failed", f"{type(action).__name__}: {message} (retry in {delay:.0f}s)",
                                   type_="Warning")
        else:
            self.failures.pop(action.key, None)
            if target and message:
                self.objects.event(*target, type(action).__name__, f"{message} in {time.perf_counter() - t0:.1f}s")
        finally:
            if self.on_action is not None:
                try:
                    self.on_action(action, ok, message, (time.perf_counter() - t0) * 1000.0)
                except Exception:  # noqa: BLE001 - a broken hook must not break reconciling
                    log.exception("on_action hook failed")
            self.wake.set()

    def _execute(self, action: Action) -> str:
        rt = self.rt
        if isinstance(action, BuildParent):
            parent = self.objects.get("ForkParent", action.parent).obj
            w = parent.spec.warmup
            from forkd.core.images import ensure_image  # builtin -> default image; oci / debian -> built once

            image_id = ensure_image(rt, parent.spec.image.model_dump(mode="json"), memory_mib=parent.spec.memoryMiB)
            rt.create_snapshot(ParentBuild.of(
                tag=action.tag, memory_mib=parent.spec.memoryMiB, vcpus=parent.spec.vcpus,
                warm_imports=tuple(w.imports),
                warm_run=tuple(w.run), warm_exec=tuple(w.exec), network=parent.spec.network, image_id=image_id,
                labels={observe.PARENT_LABEL: action.parent, observe.SPEC_HASH_LABEL: action.spec_hash}))
            return f"built snapshot {action.tag}"
        if isinstance(action, BuildLayer):
            layer = self.objects.get("ForkLayer", action.layer).obj
            rt.snapshot_diff(LayerBuild.of(tag=action.tag, parent_tag=action.from_tag, run=tuple(layer.spec.run),
                                           imports=tuple(layer.spec.imports),
                                           labels={observe.LAYER_LABEL: action.layer}))
            return f"built layer {action.tag} on {action.from_tag}"
        if isinstance(action, BuildBranch):
            from forkd.core.branch import branch

            res = branch(rt, Branch.of(child_id=action.child, tag=action.tag, mode=action.mode, wait=True,
                                       labels={observe.BRANCH_LABEL: action.branch}))
            pause = f", source paused {res.pause_ms:.0f} ms" if res.pause_ms is not None else ""
            return f"branched {action.child} into {action.tag} ({action.mode}{pause})"
        if isinstance(action, CompactSnapshot):
            rt.compact(Compaction.of(from_tag=action.from_tag, to_tag=action.tag, labels={
                observe.POOL_LABEL: action.pool, observe.COMPACTION_REASON_LABEL: action.reason}))
            return f"compacted {action.from_tag} into {action.tag} ({action.reason})"
        if isinstance(action, SpawnChildren):
            child = self.objects.get("ForkPool", action.pool).obj.spec.child
            recs = rt.fork(Spawn.of(tag=action.tag, n=action.count, pool=action.pool,
                                    memory_limit_mib=child.memoryLimitMiB))
            samples = self.spawn_ms.setdefault(action.pool, deque(maxlen=50))
            samples.extend(r.timings_ms.get("ready", 0.0) for r in recs)
            return f"spawned {len(recs)} children of {action.tag}"
        if isinstance(action, RetireChild):
            rt.kill([action.child])
            return f"retired child {action.child} ({action.reason})"
        if isinstance(action, DeleteSnapshot):
            rt.rmi(action.tag)
            return ""
        raise TypeError(f"unknown action {action!r}")

    # -- loops -------------------------------------------------------------------------------------
    def converged(self, kinds_names: list[tuple[str, str]] | None = None) -> tuple[bool, list[str]]:
        """(all Ready, problems): problems are objects Degraded for a reason waiting will not fix."""
        ready, problems = True, []
        for st in self.objects.list():
            key = (st.obj.kind, st.obj.metadata.name)
            if kinds_names is not None and key not in kinds_names:
                continue
            status = st.obj.status
            cond = status.condition("Ready") if status else None
            if not cond or cond.status != "True":
                ready = False
            deg = status.condition("Degraded") if status else None
            if deg and deg.status == "True" and deg.reason in PERMANENT_REASONS:
                problems.append(f"{key[0]}/{key[1]}: {deg.reason}: {deg.message}")
        return ready and not self.in_flight, problems

    def run_until_converged(self, timeout: float, kinds_names: list[tuple[str, str]] | None = None,
                            progress=lambda s: None) -> tuple[bool, list[str]]:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            self.step()
            ok, problems = self.converged(kinds_names)
            if ok or problems:
                return ok, problems
            summary = self._summary(kinds_names)
            if summary != last:
                progress(summary)
                last = summary
            if time.monotonic() > deadline:
                return False, [f"timed out after {timeout:.0f}s: {summary}"]
            self.wake.wait(0.25)
            self.wake.clear()

    def _summary(self, kinds_names) -> str:
        parts = []
        for st in self.objects.list():
            if kinds_names is not None and (st.obj.kind, st.obj.metadata.name) not in kinds_names:
                continue
            status = st.obj.status
            rec = status.condition("Reconciling") if status else None
            why = rec.reason if rec and rec.status == "True" else "Ready" if status else "Pending"
            extra = f" {status.warm}/{status.target} warm" if st.obj.kind == "ForkPool" and status else ""
            parts.append(f"{st.obj.kind}/{st.obj.metadata.name}: {why}{extra}")
        return "; ".join(parts)

    def run_forever(self, stop: threading.Event, interval: float = 2.0) -> None:
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the loop must survive anything one pass throws
                log.exception("reconcile pass failed")
            self.wake.wait(interval)
            self.wake.clear()

    def close(self) -> None:
        self._workers.shutdown(wait=True)
