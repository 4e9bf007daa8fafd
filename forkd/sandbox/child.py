"""One owner per running child: `Children` hands out a `ChildHandle`, the only code that touches a child's record
after its spawn, its locks (forkd.sandbox.lockpaths), its VMM and its agent connection.

Residency (`ChildRecord.residency`, shown by `forkd ls`, the API and metrics): `awake`; `paged` (the idle loop
paged its VMM's memory out to swap: forkd.vmm.pageout); `asleep` (the idle loop stopped its vCPUs, with
FORKD_IDLE_SLEEP, then paged it out). `wakes` counts the requests that resumed it or started paging it back in.
Both are written under the registry lock from the record's current content, so no other writer's copy loses them.

Sleep: the idle loop puts a child to sleep only if it gets the child's wake lock exclusively without waiting
(never while a request, a process stream or a file transfer holds it shared) and its branch lock (never under a
branch). The record says `asleep` before the VM stops; a sleep that fails puts it back. A branch of a sleeping
child captures it as it is and leaves it asleep.

A request (`ChildHandle.request`, the one door of every call to a child's agent) holds the wake lock shared while
it runs, resumes a sleeping child first and sets its wall clock from the host's (QEMU stops the guest's time with
its vCPUs; an agent of a snapshot older than the `clock` op is left as it is), and starts paging a paged-out VMM
back in on another thread (forkd.sandbox.wake). Timers inside the guest fire late by the time it slept, and a
process that works without CPU (waits on the network) is frozen with it: sleep is for children that only answer
requests (on by default; FORKD_IDLE_SLEEP=0 opts out). A guest that breaks the agent protocol is quarantined: its
VMM stopped, its record kept `failed` with the reason."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import Conflict, ForkdError, NotFound, ProtocolViolation, first_line
from forkd.base.locks import Flock, try_lock
from forkd.base.procs import is_alive
from forkd.sandbox import lockpaths, wake
from forkd.sandbox.registry import RESIDENCY, ChildRecord, Claim, Registry, this_process
from forkd.sandbox.supervisor import Supervisor, attached
from forkd.vmm.agent_client import AgentClient, AgentTimeout
from forkd.vmm.driver import RunFiles, Vm, VmmDriver, VmmLost
from forkd.vmm.pageout import PagedOut, page_out

__all__ = ["RESIDENCY", "CaptureHold", "ChildHandle", "ChildRecord", "Children", "Claim", "Registry", "SourceFate",
           "SourceLost", "clock_answered", "no_answer", "post_clock", "set_clock", "this_process", "vmm_lost"]
log = logging.getLogger(__name__)
EXIT_WAIT_SECONDS = 5.0  # a VMM whose sockets broke is exiting: how long to wait for it to be gone


class Children:
    """The node's children: their registry, and a handle per child for everything done to a running one."""

    def __init__(self, registry: Registry, driver: Callable[[], VmmDriver], home: Path):
        self.registry = registry
        self._driver = driver  # the runtime's (made on first use)
        self.home = Path(home)

    @property
    def driver(self) -> VmmDriver:
        return self._driver()

    def get(self, child_id: str) -> ChildHandle:
        return ChildHandle(self, self.registry.get(child_id))

    def of(self, rec: ChildRecord) -> ChildHandle:
        return ChildHandle(self, rec)

    def running(self) -> list[ChildHandle]:
        """A handle per recorded child whose state is running and whose VMM has a pid."""
        return [ChildHandle(self, r) for r in self.registry.list() if r.state == "running" and r.pid is not None]

    def take(self, child_id: str, still: Callable[[ChildRecord], bool] | None = None,
              wait_until: float | None = None) -> tuple[ChildRecord | None, bool]:
        """Become the operation that stops `child_id`: under the registry lock, once no other operation owns it
        (waiting until `wait_until`, if given), mark it `stopping` by this process. Returns (that record, True);
        (the record as it is, False) if it is still busy at the deadline or `still(record)` says no; (None, False)
        if it went meanwhile (someone else stopped it). NotFound if it was not there at all."""
        first = True
        while True:
            with self.registry.locked():
                try:
                    rec = self.registry.get(child_id)
                except NotFound:
                    if first:
                        raise
                    return None, False
                if not rec.busy:
                    if still is not None and not still(rec):
                        return rec, False
                    pid, started = this_process()
                    rec = rec.with_(state="stopping", stopper_pid=pid, stopper_started=started)
                    return self.registry.save(rec), True
            if wait_until is None or time.monotonic() >= wait_until:
                return rec, False
            first = False
            time.sleep(0.05)

    def mark_claimed(self, ids: list[str], at: float, ends: float | None,
                     ends_boot: float | None = None) -> list[ChildRecord]:
        """Record a claim on each child's own record (at, unless already claimed; its end on the time of day and on
        CLOCK_BOOTTIME: forkd.base.clock), from its current content; children gone meanwhile are left out."""
        out = []
        for cid in ids:
            rec = self.registry.update(cid, lambda r: r.with_(claimed_at=r.claimed_at or at, expires_at=ends,
                                                              expires_boot=ends_boot))
            if rec is not None:
                out.append(rec)
        return out


class ChildHandle:
    """One running child as its owner sees it; `rec` is its record as last read or written through the handle."""

    def __init__(self, owner: Children, rec: ChildRecord):
        self.owner, self.rec = owner, rec

    @property
    def id(self) -> str:
        return self.rec.id

    def _supervisor(self) -> Supervisor:
        return Supervisor(self.owner.registry, self.owner.driver)

    # -- requests -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def request(self, timeout: float = 10.0) -> Iterator[AgentClient]:
        """The child's agent for one request: held awake (resumed and its clock set if it slept), its memory
        paged back in if it was paged out, quarantined if its guest breaks the protocol."""
        rec = self.rec
        if rec.vmm_stopped:  # it would hold the call until its timeout (minutes for an exec): say so now
            raise no_answer(rec, None)
        with self._awake() as woke:
            if rec.status != "running":
                raise ForkdError(f"child {rec.id} is {rec.status}",
                                 hint=f"remove it with 'forkd kill {rec.id}' and fork a new one")
            paging = wake.wake(rec.pid, rec.started) is not None  # memory comes back while the request runs
            # the record is written while the agent works (joined before the wake lock goes: a sleep waits for it)
            recording = wake.record(self._woke) if woke or paging else None
            try:
                client = AgentClient.shared(rec.agent_socket, connect_timeout=timeout)
                clock = post_clock(client, time.time()) if woke else None  # served before the caller's request
                try:
                    yield client
                    clock_answered(client, clock)
                except ProtocolViolation as exc:  # the guest misbehaved: stop it, record why, tell the caller
                    self.quarantine(exc)
                    raise ProtocolViolation(f"child {rec.id} misbehaved and was stopped: {exc.message}",
                                            hint=exc.hint) from exc
                except AgentTimeout as exc:
                    raise no_answer(rec, exc) from exc
                finally:
                    if clock is not None:
                        client.forget(clock)
                    client.close()
            finally:
                if recording is not None:
                    recording.join()

    @contextlib.contextmanager
    def _awake(self) -> Iterator[bool]:
        """Hold the wake lock shared for the block; resume the child first if it sleeps. Yields True if it did."""
        d = Path(self.rec.dir)
        try:
            lock = Flock(lockpaths.wake_lock(d), shared=True)
        except FileNotFoundError:  # its directory is gone: the child was removed; the request says so
            yield False
            return
        with lock:
            legacy = os.path.lexists(d / lockpaths.ASLEEP_MARKER)
            if not (self.rec.residency == "asleep" or legacy):
                yield False
                return
            with attached(self.owner.driver, self.rec, timeout=10) as vm:
                self.owner.driver.ensure_running(vm)
            if legacy:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(d / lockpaths.ASLEEP_MARKER)
            yield True

    def _woke(self) -> None:
        """Record the child awake and count the wake. Bookkeeping: the child runs either way, so a record that
        cannot be written (a full $FORKD_HOME) does not fail the request that woke it. The record then keeps
        saying asleep (whole: it is replaced by rename) until a later request writes it; that request resumes the
        running VMM again, which changes nothing."""
        try:
            new = self.owner.registry.update(self.id, lambda r: r.with_(residency="awake", wakes=r.wakes + 1))
        except OSError as exc:
            log.warning("child %s woke but its record could not say so (%s); it runs on", self.id, exc)
            return
        if new is not None:
            self.rec = new

    def _residency(self, value: str) -> None:
        new = self.owner.registry.update(self.id, lambda r: r.with_(residency=value))
        if new is not None:
            self.rec = new

    # -- the idle loop's side -----------------------------------------------------------------------------
    def sleep(self) -> bool:
        """Stop the child's vCPUs and record it asleep, unless a request or a branch is in flight (then False;
        the idle loop tries again in the child's next idle stretch)."""
        try:
            wake_lock = Flock(lockpaths.wake_lock(Path(self.rec.dir)), blocking=False)
        except BlockingIOError:
            return False
        with wake_lock:
            branch = try_lock(lockpaths.branch_lock(self.owner.home, self.id))
            if branch is None:
                return False
            with branch:
                was = self.rec.residency
                self._residency("asleep")
                try:
                    with attached(self.owner.driver, self.rec) as vm:
                        self.owner.driver.pause(vm)
                except BaseException:
                    self._residency(was)
                    raise
        return True

    def page_out(self, scope: str = "private") -> PagedOut:
        """Page the VMM's private memory out to swap (forkd.vmm.pageout); an awake child is then `paged`."""
        out = page_out(self.rec.pid, self.rec.started, scope)
        if self.rec.residency == "awake":
            self._residency("paged")
        return out

    def page_in(self, min_kib: int = wake.MIN_SWAPPED_KIB) -> int:
        """Page the VMM back in on this thread if it has at least `min_kib` in swap (a diff branch, before its
        pause), counted as a wake; a page-in already running is waited for first. The KiB read back."""
        if self.rec.pid is None:
            return 0
        kib = wake.page_in_now(self.rec.pid, self.rec.started, min_kib)
        if kib > 0:
            self._woke()
        return kib

    # -- a branch's hold on it ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def vmm(self) -> Iterator[Vm]:
        """Its VMM, attached for the block (not connected: enough to look at its process and memory)."""
        driver = self.owner.driver
        vm = driver.attach(RunFiles(Path(self.rec.dir)), self.rec.pid, self.rec.started)
        try:
            yield vm
        finally:
            driver.release(vm)

    def hold_for_capture(self, stack: contextlib.ExitStack, max_branches: int) -> CaptureHold:
        """Take what a branch of this child holds, on `stack` (released when it unwinds): its branch lock (one
        branch of a source at a time; the idle loop's sleep waits for it too), a branch slot (at most
        `max_branches` per home, across processes) and its VMM, attached, which the stack resumes if a failure
        passes it (forkd.sandbox.child.CaptureHold). Returns the hold; Conflict naming what is in the way."""
        home, driver = self.owner.home, self.owner.driver
        lock = try_lock(lockpaths.branch_lock(home, self.id))
        if lock is None:
            raise Conflict(f"child {self.id} is already being branched",
                           hint="branches of one source run one at a time; retry when the other one returned")
        stack.enter_context(lock)
        for i in range(max_branches):
            slot = try_lock(lockpaths.branch_slot(home, i))
            if slot is not None:
                stack.enter_context(slot)
                break
        else:
            raise Conflict(f"{max_branches} branches are already in flight (background conversions included)",
                           hint="retry when one finished (FORKD_MAX_BRANCHES raises the cap)")
        hold = CaptureHold(driver.attach(RunFiles(Path(self.rec.dir)), self.rec.pid, self.rec.started), lock, driver)
        stack.push(hold.exit)  # the source resumed (unless lost) and its VMM released, whatever happens
        return hold

    def fate(self, exc: BaseException) -> SourceFate | None:
        """After `exc` broke an operation holding it (a branch): what became of the child if it is no longer
        running (`removed` once its record is gone), else None. A VMM whose sockets broke (`vmm_lost`: the
        driver's VmmLost, told apart by type) is exiting: it is given EXIT_WAIT_SECONDS to be gone before its
        status is read."""
        try:
            rec = self.owner.registry.get(self.id)
        except NotFound:
            return SourceFate("removed")
        if rec.pid and vmm_lost(exc):
            deadline = time.monotonic() + EXIT_WAIT_SECONDS
            while is_alive(rec.pid, rec.started) and time.monotonic() < deadline:
                time.sleep(0.02)
        return None if rec.status == "running" else SourceFate(rec.status, rec.memory_limit_mib)

    @property
    def asleep(self) -> bool:
        return self.rec.residency == "asleep" or os.path.lexists(Path(self.rec.dir) / lockpaths.ASLEEP_MARKER)

    # -- its VMM --------------------------------------------------------------------------------------
    def ensure_running(self) -> bool:
        """Resume a VMM left paused (a branch whose process died between pause and resume); never a sleeping
        child, which its next request resumes. True if it had to be resumed."""
        if self.asleep:
            return False
        return self._supervisor().ensure_running(self.rec)

    def quarantine(self, exc: BaseException) -> None:
        self._supervisor().quarantine(self.rec, exc)

    def console(self, offset: int = 0) -> tuple[int, bytes]:
        """Its console log from byte `offset`: (where the next read starts, the bytes). The VMM's ring is drained
        into the log file first (best effort: the file holds what was drained before); an offset past the end,
        after the log was cut, starts again from its beginning."""
        rec, driver = self.rec, self.owner.driver
        files = RunFiles(Path(rec.dir))
        if rec.status == "running":
            vm = driver.attach(files, rec.pid, rec.started)
            try:
                driver.connect(vm, timeout=5)
                driver.save_console(vm)
            except Exception:  # noqa: BLE001 - a VMM that does not answer leaves the log as it was
                log.debug("child %s: console not drained", rec.id, exc_info=True)
            finally:
                driver.release(vm)
        try:
            data = files.console.read_bytes()
        except FileNotFoundError:
            data = b""
        return len(data), data[offset if offset <= len(data) else 0:]

    # -- its end --------------------------------------------------------------------------------------
    def kill(self, wait_until: float | None = None) -> bool | None:
        """Stop it and drop its record and files once no other operation owns it (waiting until `wait_until`):
        True if its VMM was running, False if it was not or someone else stopped it meanwhile, None if another
        operation still owns it at the deadline (then `rec` is its record as that operation left it)."""
        try:
            rec, owned = self.owner.take(self.id, wait_until=wait_until)
        except NotFound:
            return False
        if owned:
            return self._supervisor().kill(rec)
        if rec is None:
            return False
        self.rec = rec
        return None

    def retire(self, still: Callable[[ChildRecord], bool]) -> bool:
        """Stop it for the reconciler if it still qualifies: `still(record)` is checked under the registry lock
        against its current record (a child claimed since the decision stays), and a child another operation is
        creating or stopping is left alone. True if it was retired."""
        rec, owned = self.owner.take(self.id, still)
        if rec is None or not owned:
            return False
        self._supervisor().kill(rec)
        return True

    def refresh(self) -> ChildHandle:
        """The handle with the child's record as it is now (NotFound once it is gone)."""
        self.rec = self.owner.registry.get(self.id)
        return self


@dataclass(frozen=True)
class SourceFate:
    """What became of a child an operation held when it failed (ChildHandle.fate): what `ls` shows for it (dead,
    oom-killed, failed, ...; `removed` once its record is gone), and its memory limit (what an OOM kill hit)."""

    status: str
    memory_limit_mib: int | None = None


class SourceLost(Conflict):
    """The source child died (or was removed) while it was being branched; `fate` is what `ls` shows for it."""

    def __init__(self, message: str, hint: str | None = None, *, fate: str = "dead", **kw):
        super().__init__(message, hint, **kw)
        self.fate = fate


@dataclass
class CaptureHold:
    """What a branch holds of its source while it captures it (ChildHandle.hold_for_capture): the attached VMM and
    the branch lock until `free`, and whether the source ran when the hold connected, which every way out
    restores: a failure that passes the hold's place on the branch's stack resumes the source (`resume_after`)
    unless it is lost (SourceLost) or was freed, then the VMM is released."""

    vm: Vm
    lock: Flock
    driver: VmmDriver
    was_running: bool = False
    connected: bool = False
    freed: bool = False
    resumed_after: bool = False

    def connect(self, timeout: float = 30.0) -> None:
        """Connect to the source's VMM and note whether it runs (what `resume` puts back)."""
        self.driver.connect(self.vm, timeout=timeout)
        self.was_running = self.driver.run_state(self.vm) == "running"
        self.connected = True

    def resume(self) -> None:
        """Make sure the source runs again (a no-op if it does); the driver's error if it cannot."""
        self.driver.ensure_running(self.vm)

    def resume_after(self, exc: BaseException) -> None:
        """Resume the source (if it ran when connected) while `exc` is on its way out, once: a resume that fails
        too is noted on `exc`, never raised in its place (the source may be dead: the caller reports its fate)."""
        if not (self.connected and self.was_running) or self.freed or self.resumed_after:
            return
        self.resumed_after = True
        try:
            self.resume()
        except (ForkdError, OSError) as again:
            exc.add_note(f"resuming the source failed too: {first_line(again)}")

    def free(self) -> None:
        """The source is free (its capture is over): release its VMM and its branch lock, so another branch of it
        may start while this one finishes."""
        self.freed = True
        self.driver.release(self.vm)
        self.lock.release()

    def exit(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        """The hold's place on the branch's stack: resume on a failure, then release the VMM."""
        try:
            if exc is not None and not isinstance(exc, SourceLost):
                self.resume_after(exc)
        finally:
            self.driver.release(self.vm)
        return False


def vmm_lost(exc: BaseException | None) -> bool:
    """True if `exc` or anything in its chain says a VMM's socket broke (the driver's VmmLost, or the OS's)."""
    for _ in range(16):
        if exc is None:
            return False
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, VmmLost)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def set_clock(agent: AgentClient, now: float) -> None:
    """The guest's wall clock to `now` after a sleep; an agent without the `clock` op is left as it is."""
    clock_answered(agent, post_clock(agent, now))


def post_clock(agent: AgentClient, now: float) -> int | None:
    """Send the guest's wall clock (`now`) after a sleep without waiting for the answer: the agent serves it before
    it reads the next request (`clock` is not one of the ops it runs on a thread), so the request sent next sees
    the right time, and waking costs no round trip of its own. The request id, for `clock_answered`."""
    try:
        return agent.post("clock", {"time": now})
    except ForkdError as exc:
        log.debug("child's clock not sent after its sleep: %s", exc.message)
        return None


def clock_answered(agent: AgentClient, rid: int | None) -> None:
    """Read the answer to `post_clock` (by then it came before the request's own); an agent without the `clock` op
    is left as it is."""
    if rid is None:
        return
    try:
        agent.answer("clock", rid, timeout=5)
    except ForkdError as exc:
        log.debug("child's clock not set after its sleep: %s", exc.message)


def no_answer(rec: ChildRecord, exc: AgentTimeout | None) -> AgentTimeout:
    """The error of a call on a child that does not answer, naming the child and, when its VMM is stopped
    (SIGSTOP, a tracer), saying so and how out."""
    if rec.vmm_stopped:
        return AgentTimeout(f"child {rec.id} does not answer: its VMM (pid {rec.pid}) is stopped",
                            hint=f"continue it (kill -CONT {rec.pid}) or remove the child ('forkd kill {rec.id}')")
    return AgentTimeout(f"child {rec.id} did not answer in time: {exc.message if exc else 'no reply'}",
                        hint=f"retry with a longer timeout, or remove the child ('forkd kill {rec.id}')")

