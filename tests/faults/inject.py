"""Faults injected for real into a running daemon's home, each checked against its promise (docs/faults.md):
what bench/soak.py interleaves with its churn. Each returns an Outcome: held, or what broke.

- `hung_vmm`: a claimed child's VMM stopped (SIGSTOP): a call on it fails within its timeout naming the child,
  another child answers, the daemon answers, `kill` removes it;
- `tmpfs_full`: the tmpfs of flat images (FORKD_SHM, a size-limited mount) filled: a spawn needing a new flat
  image fails naming FORKD_SHM, a running child lives on, and the same spawn works once space is freed;
- `home_full`: $FORKD_HOME (a loop-mounted filesystem) filled with one ballast file during a live branch, a layer
  build, a pack unpack and the audit appends of those requests: each fails naming the lack of space, none leaves
  its snapshot `ready` or its work in tmp/, the audit log's chain stays intact, the source child answers, and
  all of it works again once the ballast is deleted;
- `daemon_kill`: the daemon kill -9'd and restarted: a claimed child survives it and answers, the pools refill.

After every fault the pools must be back at their target (`refilled`): a fault that leaves a pool short for good
(a child counted against it that nothing will remove, a spawn that keeps failing once space is freed) broke its
promise even if every check above held. The wait is a stall budget, as the crash harness's (tests/chaos/recovery.py):
a pool still moving (children spawning, states changing) is given time, one that does not move for REFILL_STALL_S
is not.

Every process is found by the pid in its record, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.errors import NotFound
from forkd.base.owners import dead_under, owned_under
from forkd.core.audit import verify
from forkd.core.requests import Branch, Compaction, LayerBuild, Spawn
from forkd.reconciler.objects import ObjectStore
from forkd.store.snapshot import Snapshot
from tests.chaos import recovery
from tests.chaos.invariants import check_pools, check_snapshots
from tests.faults.mounts import MIB, fill

EXEC_TIMEOUT = 5.0  # seconds a call on a stopped VMM is given
REFILL_STALL_S = 240.0  # the pools short of their target not moving this long after a fault: they will not refill
REFILL_CAP_S = 900.0  # nor, moving or not, after this long in all


@dataclass
class Outcome:
    fault: str
    broken: list[str] = field(default_factory=list)  # promises that did not hold
    seconds: float = 0.0  # from injection to everything back in order

    @property
    def held(self) -> bool:
        return not self.broken


def refilled(out: Outcome, rt, pools: Callable[[], list[dict]], stall: float = REFILL_STALL_S,
             cap: float = REFILL_CAP_S, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Wait for the pools (`pools()`: as the daemon's API gives them) to be back at their target, judged from the
    children's records (a pool whose maxChildren claimed children fill need only what room is left); the seconds
    it took, or None with the pools still short, and why, added to `out.broken`."""
    waited, why = recovery.wait_pools(lambda: (pools(), rt.registry.list()), stall, cap, clock, sleep)
    if waited is None:
        try:
            short = check_pools(pools(), rt.registry.list(),
                                lambda name: ObjectStore(rt.layout).events("ForkPool", name))
        except OSError as exc:
            short = [f"the daemon does not answer: {exc}"]
        out.broken.append(f"the pools are not back at their target after the fault ({why}): {'; '.join(short)}")
    return waited


def _answers(api, cid: str) -> str | None:
    """None if child `cid` runs a command; else why not."""
    try:
        out = api.exec(cid, ["echo", "ok"], timeout=60)
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        return f"{type(exc).__name__}: {exc}"
    return None if out.get("stdout", "").strip() == "ok" else f"answered {out!r}"


def hung_vmm(api, rt, pool: str) -> Outcome:
    out, t0 = Outcome("hung_vmm"), time.monotonic()
    hung, other = (c["id"] for c in api.claim(pool, 2))
    pid = rt.child(hung).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        try:
            api.exec(hung, ["true"], timeout=EXEC_TIMEOUT)
            out.broken.append(f"exec on child {hung} with its VMM stopped succeeded")
        except Exception as exc:  # noqa: BLE001 - the error's wording is the promise checked
            if hung not in str(exc):
                out.broken.append(f"the error of a call on stopped child {hung} does not name it: {exc}")
        if (why := _answers(api, other)) is not None:
            out.broken.append(f"child {other} beside a stopped VMM does not answer: {why}")
    finally:
        api.kill([hung, other])
    if hung in {c.id for c in rt.children()}:
        out.broken.append(f"child {hung} (VMM stopped) is still listed after kill")
    with contextlib.suppress(ProcessLookupError):
        if Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]:
            out.broken.append(f"the stopped VMM {pid} of child {hung} outlived its kill")
            os.kill(pid, signal.SIGKILL)
    out.seconds = time.monotonic() - t0
    return out


def tmpfs_full(api, rt, pool: str, shm: Path, n: int) -> Outcome:
    """`shm` is the size-limited tmpfs FORKD_SHM points at."""
    out, t0 = Outcome("tmpfs_full"), time.monotonic()
    src = api.claim(pool, 1)[0]["id"]
    tag, made = f"soak-fault-{n}", []
    try:
        api.branch(Branch(child_id=src, tag=tag, mode="live"))
        rt.store.flat_path(rt.store.get(tag)).unlink(missing_ok=True)  # the branch kept one: a cache, made again
        filler = fill(shm)  # by the next spawn, which now needs room for it
        try:
            try:
                made += [c["id"] for c in api.fork(Spawn(tag=tag))]
                out.broken.append(f"a spawn of {tag} needing a new flat image succeeded on a full tmpfs")
            except Exception as exc:  # noqa: BLE001 - the error's wording is the promise checked
                if "FORKD_SHM" not in str(exc) and "FORKD_SHM" not in str(getattr(exc, "hint", "")):
                    out.broken.append(f"the refused spawn does not name FORKD_SHM: {exc}")
            if (why := _answers(api, src)) is not None:
                out.broken.append(f"running child {src} does not answer while the tmpfs is full: {why}")
        finally:
            filler.unlink()
        try:
            made += [c["id"] for c in api.fork(Spawn(tag=tag))]
        except Exception as exc:  # noqa: BLE001
            out.broken.append(f"a spawn of {tag} still fails once space is freed: {exc}")
    finally:
        with contextlib.suppress(Exception):
            api.kill([src, *made])
        with contextlib.suppress(Exception):
            api.rmi(tag)
    out.seconds = time.monotonic() - t0
    return out


def daemon_kill(api, rig, pool: str, wait_warm) -> Outcome:
    """`wait_warm(rig)` returns once every pool is back at its target."""
    out, t0 = Outcome("daemon_kill"), time.monotonic()
    held = api.claim(pool, 1)[0]["id"]
    try:
        rig.kill_daemon()
        rig.start_daemon()
        wait_warm(rig)
        if (why := _answers(api, held)) is not None:
            out.broken.append(f"claimed child {held} does not answer after a daemon restart: {why}")
    finally:
        with contextlib.suppress(Exception):
            api.kill([held])
    out.seconds = time.monotonic() - t0
    return out


HOME_FULL_RUN = ("dd if=/dev/urandom of=/root/r bs=1M count=8",)  # the layer a home_full fault builds


def _refused_for_space(out: Outcome, what: str, call) -> None:
    """`call()` on a full home must fail, its error naming the lack of space."""
    try:
        call()
        out.broken.append(f"{what} succeeded on a full $FORKD_HOME")
    except Exception as exc:  # noqa: BLE001 - the error's wording is the promise checked
        said = f"{exc} {getattr(exc, 'hint', '') or ''}".lower()
        if "space" not in said:
            out.broken.append(f"{what} on a full $FORKD_HOME failed without naming the lack of space: {exc}")


def _whole(out: Outcome, rt, when: str) -> None:
    """No snapshot half-made and `ready`, no temporary left in tmp/ or by a dead maker, the audit chain intact."""
    out.broken += [f"{when}: {v}" for v in check_snapshots(rt)]
    if left := [p.name for p, _ in owned_under(rt.layout.tmp)] + [p.name for p in dead_under(rt.layout.home)]:
        out.broken.append(f"{when}: temporaries left behind: {left}")
    v = verify(rt.layout.home)
    if v.bad_line is not None or v.torn:
        out.broken.append(f"{when}: the audit log does not verify: {v}")


def _not_ready(out: Outcome, rt, tag: str, what: str) -> None:
    snap = next((s for s in rt.store.list() if isinstance(s, Snapshot) and s.tag == tag), None)
    if snap is not None and snap.status == "ready":
        out.broken.append(f"{what} failed on a full $FORKD_HOME yet snapshot {tag} is ready")


def _branch(api, src: str, tag: str):
    return lambda: api.branch(Branch(child_id=src, tag=tag, mode="live"))


def _layer(api, tag: str, parent: str):
    return lambda: api.snapshot_diff(LayerBuild(tag=tag, parent_tag=parent, run=HOME_FULL_RUN))


def _while_full(out: Outcome, api, rt, src: str, tags: dict[str, str]) -> None:
    """The live branch and the layer build refused; the home is full when called."""
    _refused_for_space(out, f"a live branch of {src}", _branch(api, src, tags["branch"]))
    _not_ready(out, rt, tags["branch"], "the live branch")
    _refused_for_space(out, "a layer build", _layer(api, tags["layer"], tags["parent"]))
    _not_ready(out, rt, tags["layer"], "the layer build")
    _whole(out, rt, "with the home full")
    if (why := _answers(api, src)) is not None:
        out.broken.append(f"child {src} does not answer while $FORKD_HOME is full: {why}")
    for tag in (tags["branch"], tags["layer"]):  # a failed record, if one was kept, goes before the next try
        with contextlib.suppress(Exception):
            api.rmi(tag)


def _unpack_while_full(out: Outcome, api, rt, tag: str, pack_file: Path) -> None:
    """The unpack of `pack_file` (whose head is `tag`) refused; the home has a little room left when called."""
    _refused_for_space(out, f"an unpack of {pack_file}", lambda: api.unpack(str(pack_file)))
    _not_ready(out, rt, tag, "the unpack")
    _whole(out, rt, "after an unpack on a full home")


def _works(out: Outcome, rt, what: str, call, tag: str) -> None:
    try:
        call()
        if (status := rt.store.get(tag).status) != "ready":
            out.broken.append(f"{what} once space is freed left {tag} {status}")
    except Exception as exc:  # noqa: BLE001
        out.broken.append(f"{what} still fails once space is freed: {type(exc).__name__}: {exc}")


def _once_freed(out: Outcome, api, rt, src: str, tags: dict[str, str], pack_file: Path) -> None:
    """The same operations once the ballast is gone: each must work. The first run packs its layer to
    `pack_file`, compacted under the tag `tags["packed"]` first (a pack may not hold the reconciler's parent);
    every run then unpacks that pack."""
    _works(out, rt, "the live branch", _branch(api, src, tags["branch"]), tags["branch"])
    _works(out, rt, "the layer build", _layer(api, tags["layer"], tags["parent"]), tags["layer"])
    try:
        if not pack_file.exists():
            api.compact(Compaction(from_tag=tags["layer"], to_tag=tags["packed"]))
            api.pack(tags["packed"], str(pack_file))
        with contextlib.suppress(NotFound):
            api.rmi(tags["packed"])
    except Exception as exc:  # noqa: BLE001
        out.broken.append(f"packing layer {tags['layer']} fails: {type(exc).__name__}: {exc}")
        return
    _works(out, rt, f"the unpack of {pack_file}", lambda: api.unpack(str(pack_file)), tags["packed"])


def home_full(api, rt, pool: str, parent: str, pack_file: Path, n: int) -> Outcome:
    """$FORKD_HOME (its own small filesystem) filled with a ballast file. `parent` is the snapshot layers are built
    on; `pack_file` (outside the home) is made by the first run from the layer it builds, and unpacked by every
    later one while the home is full, with some room left so the unpack fails halfway through. Tags made are
    deleted again."""
    out, t0 = Outcome("home_full"), time.monotonic()
    tags = {"branch": f"soak-full-br-{n}", "layer": f"soak-full-layer-{n}", "parent": parent,
            "packed": "soak-full-packed"}
    src = api.claim(pool, 1)[0]["id"]
    try:
        api.exec(src, ["sh", "-c", "dd if=/dev/urandom of=/root/r bs=1M count=16"], timeout=120)
        had_pack, lost = pack_file.exists(), verify(rt.layout.home).lost
        ballast = fill(rt.layout.home)
        try:
            _while_full(out, api, rt, src, tags)
            lost += verify(rt.layout.home).pending_lost  # the audit appends of the refused requests
            if had_pack:
                ballast.unlink()
                ballast = fill(rt.layout.home, leave=64 * MIB)
                _unpack_while_full(out, api, rt, tags["packed"], pack_file)
        finally:
            ballast.unlink()
        _once_freed(out, api, rt, src, tags, pack_file)
        _whole(out, rt, "once space is freed")
        if not (v := verify(rt.layout.home)).ok or v.lost < lost:
            out.broken.append(f"the audit log once space is freed does not verify or name the {lost} entries lost "
                              f"so far: {v}")
    finally:
        with contextlib.suppress(Exception):
            api.kill([src])
        for tag in (tags["branch"], tags["layer"], tags["packed"]):
            with contextlib.suppress(Exception):
                api.rmi(tag)
    out.seconds = time.monotonic() - t0
    return out
