"""The host clock stepped while sandbox lifetimes run: the sweeper (forkd.core.lifetimes.sweep, what the daemon's
sweeper thread runs) must end no child early when the time of day jumps forward, and keep none longer when it
jumps back.

The clocks are stepped through forkd.base.clock, the one seam lifetimes read time from: the time of day cannot be
stepped for real without stepping it for every process on the host, and a time namespace (`unshare --time`) moves
CLOCK_BOOTTIME and CLOCK_MONOTONIC only, never the time of day (and changes the process start times a child's
identity is checked by). The sweep, the records and the kill are real; each child's "VMM" is a real process of
this test (`sleep`), killed by the sweep when its lifetime is over."""

from __future__ import annotations

import subprocess
import time

import pytest

from forkd.base import clock
from forkd.base.paths import Layout
from forkd.base.procs import start_time
from forkd.core.lifetimes import stamp, sweep
from forkd.core.runtime import Runtime
from forkd.sandbox.registry import ChildRecord
from tests.chaos.test_gc_build_vmm import private_home  # noqa: F401 - a fixture

pytestmark = pytest.mark.faults
DAY = 86400.0


@pytest.fixture
def sandboxes(private_home, monkeypatch):  # noqa: F811
    """make(cid, seconds) -> a running hand-made child of `seconds` lifetime, its VMM a real process."""
    monkeypatch.setenv("FORKD_HOME", str(private_home))
    rt = Runtime(Layout(private_home))
    procs = []

    def make(cid: str, seconds: float) -> ChildRecord:
        p = subprocess.Popen(["sleep", "600"])
        procs.append(p)
        rt.registry.save(ChildRecord(id=cid, snapshot="s", created_at=time.time(), dir=str(rt.registry.path(cid)),
                                     memory_mib=256, vcpus=1, accel="tcg", pid=p.pid, started=start_time(p.pid),
                                     state="running"))
        return stamp(rt, [cid], seconds)[0]

    yield rt, make
    for p in procs:
        p.kill()
        p.wait()


def _step(monkeypatch, wall: float = 0.0, elapsed: float = 0.0) -> None:
    """The time of day stepped by `wall` seconds; `elapsed` seconds really passed (CLOCK_BOOTTIME)."""
    real_wall, real_elapsed = clock.wall, clock.elapsed
    monkeypatch.setattr(clock, "wall", lambda: real_wall() + wall)
    monkeypatch.setattr(clock, "elapsed", lambda: real_elapsed() + elapsed)


def test_a_clock_stepped_forward_ends_no_lifetime_early(sandboxes, monkeypatch):
    rt, make = sandboxes
    rec = make("c0000000001", 600)
    _step(monkeypatch, wall=DAY)  # a day later by the time of day, a moment later in truth
    assert sweep(rt).expired == []
    assert rt.child(rec.id).status == "running"


def test_a_clock_stepped_back_keeps_no_lifetime_longer(sandboxes, monkeypatch):
    rt, make = sandboxes
    rec = make("c0000000002", 600)
    _step(monkeypatch, wall=-DAY, elapsed=601)  # its 600 s passed, though the time of day went back a day
    assert sweep(rt).expired == [rec.id]
    assert rec.id not in {c.id for c in rt.children()}
    assert start_time(rec.pid) is None  # its VMM was killed


def test_a_lifetime_still_ends_on_time_without_a_step(sandboxes, monkeypatch):
    rt, make = sandboxes
    short, long_ = make("c0000000003", 60), make("c0000000004", 600)
    _step(monkeypatch, wall=61, elapsed=61)
    assert sweep(rt).expired == [short.id]
    assert [c.id for c in rt.children()] == [long_.id]
