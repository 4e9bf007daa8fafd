"""The executor and the loop: plan, perform the actions through the core, record events, failures (with
back-off) and statuses; again on every change and on an interval.

Each pass observes the world once and resolves it into one World (forkd.reconciler.world) that both plan() and the
statuses read. Actions dispatch through forkd.reconciler.handlers' table: slow ones (building a snapshot, spawning
children) run on worker threads and are tracked as in flight, so a slow or broken object never stalls the others;
quick ones (retire a child, delete a snapshot) run inline. A failure is retried with back-off, unless it is a
TerminalError: that one waits for the spec to change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from forkd.base.errors import TerminalError, first_line
from forkd.base.telemetry import observe as observe_latency
from forkd.base.telemetry import timed
from forkd.reconciler import observe
from forkd.reconciler.actions import Action
from forkd.reconciler.handlers import HANDLERS, Context
from forkd.reconciler.objects import ObjectStore
from forkd.reconciler.objects import key as qualified
from forkd.reconciler.plan import backoff_seconds, plan_world
from forkd.reconciler.state import Failure
from forkd.reconciler.status import world_status
from forkd.reconciler.world import World, resolve
from forkd.spec.models import Status

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime

log = logging.getLogger("forkd.reconciler")
MAX_PASSES = 3  # a pass that changed the world inline is followed by another, so statuses show what it did


class Reconciler:
    def __init__(self, rt: Runtime, objects: ObjectStore | None = None, workers: int = 3,
                 on_action: Callable[[Action, bool, str, float], None] | None = None):
        self.rt = rt
        self.on_action = on_action  # called after every action with (action, ok, message, ms), e.g. the audit log
        self.objects = objects or ObjectStore(rt.layout)
        self.failures: dict[str, Failure] = {}
        self.in_flight: dict[str, Future] = {}
        self.spawn_ms: dict[str, deque[float]] = {}
        self.world: World | None = None  # the last pass's view: what `converged` reports as stuck
        self.wake = threading.Event()
        self._ctx = Context(rt, self.objects, self.spawn_ms, self._claim)
        self._lock = threading.Lock()
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="forkd-action")

    def _claim(self, pool: str, n: int) -> list:
        """A ForkClaim's children, through the same claim path `forkd claim` takes."""
        from forkd.reconciler.control import Control  # control builds reconcilers: imported here, not at the top

        return Control(self.rt, reconciler=self).claim(pool, n)

    # -- one pass ----------------------------------------------------------------------------------
    def step(self) -> list[Action]:
        """Plan against the world as it is now, start what is not already running, update statuses; once more
        (up to MAX_PASSES) while a pass changed the world inline. Returns every action planned."""
        with self._lock, timed("reconcile"):
            planned: list[Action] = []
            for _ in range(MAX_PASSES):
                actions, changed = self._pass()
                planned += actions
                if not changed:
                    break
            return planned

    def _pass(self) -> tuple[list[Action], bool]:
        """One pass over one World: (the actions planned, whether any ran inline)."""
        self._reap_finished()
        world = self._resolve()
        actions = plan_world(world)
        inline = False
        for action in actions:
            if action.key in self.in_flight:
                continue
            if HANDLERS[type(action)].slow:
                self.in_flight[action.key] = self._workers.submit(self._run, action)
            else:
                self._run(action)
                inline = True
        self._write_statuses(world)
        self.world = world
        return actions, inline

    def _resolve(self) -> World:
        p50s = tuple((pool, sorted(v)[len(v) // 2]) for pool, v in sorted(self.spawn_ms.items()) if v)
        actual = observe.actual(self.rt, tuple(self.failures.values()), frozenset(self.in_flight), p50s,
                                self.objects)
        return resolve(observe.desired(self.objects), actual)

    def _reap_finished(self) -> None:
        for key, fut in list(self.in_flight.items()):
            if fut.done():
                del self.in_flight[key]

    def _write_statuses(self, world: World) -> None:
        previous = {f"{st.obj.kind}/{qualified(st.obj)}": st.obj.status for st in self.objects.list()}
        for key, status in world_status(world, previous).items():
            kind, name = key.split("/", 1)
            if kind == "ForkPool" and name in self.spawn_ms and self.spawn_ms[name]:
                samples = sorted(self.spawn_ms[name])
                status = status.model_copy(update={"spawnP50Ms": round(samples[len(samples) // 2], 1)})
            if self.objects.set_status(kind, name, status):
                self._warn_on_degraded(kind, name, previous.get(key), status)

    def _warn_on_degraded(self, kind: str, name: str, old: Status | None, new: Status) -> None:
        """A Warning event when an object becomes Degraded for a reason found at status level (SourceNotFound,
        NetworkMismatch, ChildOOMKilled, PoolNotFound, ...); failed actions have their own Failed event."""
        deg = new.condition("Degraded")
        if deg is None or deg.status != "True" or deg.reason.endswith("Failed"):
            return
        was = old.condition("Degraded") if old is not None else None
        if was is None or was.status != "True" or was.reason != deg.reason:
            self.objects.event(kind, name, deg.reason, deg.message, type_="Warning")

    # -- executor ----------------------------------------------------------------------------------
    def _run(self, action: Action) -> None:
        t0 = time.perf_counter()
        ok, message = False, ""
        try:
            message = HANDLERS[type(action)].run(self._ctx, action)
            ok = True
        except Exception as exc:  # noqa: BLE001 - any failure is recorded, backed off and shown in status
            message = first_line(exc)
            self._failed(action, message, terminal=isinstance(exc, TerminalError))
        else:
            self.failures.pop(action.key, None)
            if action.owner and message:
                self.objects.event(*action.owner, type(action).__name__,
                                   f"{message} in {time.perf_counter() - t0:.1f}s")
        finally:
            observe_latency("reconcile_action", time.perf_counter() - t0, action=type(action).__name__,
                            pool=action.owner[1] if action.owner and action.owner[0] == "ForkPool" else "")
            if self.on_action is not None:
                try:
                    self.on_action(action, ok, message, (time.perf_counter() - t0) * 1000.0)
                except Exception:  # noqa: BLE001 - a broken hook must not break reconciling
                    log.exception("on_action hook failed")
            self.wake.set()

    def _failed(self, action: Action, message: str, terminal: bool) -> None:
        """Record the failure: retried after a back-off, or (terminal) not while plan asks for the same action."""
        attempts = self.failures[action.key].attempts + 1 if action.key in self.failures else 1
        delay = 0.0 if terminal else backoff_seconds(attempts)
        self.failures[action.key] = Failure(*action.key.split("/", 1), message=message, attempts=attempts,
                                            retry_at=time.time() + delay, terminal=terminal, action=action)
        when = "not retried until the spec changes" if terminal else f"retry in {delay:.0f}s"
        log.warning("%s failed (attempt %d, %s): %s", action.key, attempts, when, message)
        if action.owner:
            self.objects.event(*action.owner, "Failed", f"{type(action).__name__}: {message} ({when})",
                               type_="Warning")

    # -- loops -------------------------------------------------------------------------------------
    def converged(self, kinds_names: list[tuple[str, str]] | None = None) -> tuple[bool, list[str]]:
        """(all Ready, problems): problems are objects that are not Ready and will not be until their spec (or what
        it names) changes: stuck by a rule of the last pass's World, or failed with a TerminalError."""
        ready, problems = True, []
        terminal = self.world.terminal if self.world is not None else frozenset()
        for st in self.objects.list():
            key = (st.obj.kind, qualified(st.obj))
            if kinds_names is not None and key not in kinds_names:
                continue
            status = st.obj.status
            cond = status.condition("Ready") if status else None
            if cond is not None and cond.status == "True":
                continue
            ready = False
            ref = f"{key[0]}/{key[1]}"
            deg = status.condition("Degraded") if status else None
            if ref in terminal and ref not in self.in_flight and deg is not None and deg.status == "True":
                problems.append(f"{ref}: {deg.reason}: {deg.message}")
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
            if kinds_names is not None and (st.obj.kind, qualified(st.obj)) not in kinds_names:
                continue
            status = st.obj.status
            rec = status.condition("Reconciling") if status else None
            why = rec.reason if rec and rec.status == "True" else "Ready" if status else "Pending"
            extra = f" {status.warm}/{status.target} warm" if st.obj.kind == "ForkPool" and status else ""
            parts.append(f"{st.obj.kind}/{qualified(st.obj)}: {why}{extra}")
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
