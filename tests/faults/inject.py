"""Faults injected for real into a running daemon's home, each checked against its promise (docs/faults.md):
what bench/soak.py interleaves with its churn. Each returns an Outcome: held, or what broke.

- `hung_vmm`: a claimed child's VMM stopped (SIGSTOP): a call on it fails within its timeout naming the child,
  another child answers, the daemon answers, `kill` removes it;
- `tmpfs_full`: the tmpfs of flat images (FORKD_SHM, a size-limited mount) filled: a spawn needing a new flat
  image fails naming FORKD_SHM, a running child lives on, and the same spawn works once space is freed;
- `daemon_kill`: the daemon kill -9'd and restarted: a claimed child survives it and answers, the pools refill.

Every process is found by the pid in its record, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from forkd.core.requests import Branch, Spawn
from tests.faults.mounts import fill

EXEC_TIMEOUT = 5.0  # seconds a call on a stopped VMM is given


@dataclass
class Outcome:
    fault: str
    broken: list[str] = field(default_factory=list)  # promises that did not hold
    seconds: float = 0.0  # from injection to everything back in order

    @property
    def held(self) -> bool:
        return not self.broken


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
