"""The crash harness: a daemon under mixed load, kill -9'd (with some of the CLI processes talking to it) at seeded
random points, restarted, and checked against tests/chaos/invariants.py after every restart.

A round: load for a seeded random time -> kill -9 the daemon and, each with probability `cli_kill_p`, every
in-flight CLI process -> sometimes (`gap_op_p`) start a CLI layer build while no daemon answers (it runs
in-process) -> restart the daemon -> the remaining CLI processes finish -> wait until every pool is back at its
target (the time to recover) -> check every invariant. The operations and kill points are drawn from the seed, so a
seed replays the same schedule; what the VMs do meanwhile is timing, which no seed fixes."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from forkd.reconciler.objects import ObjectStore
from tests.chaos import invariants as inv
from tests.chaos import recovery
from tests.chaos.load import POOL, Load, LoadState, error_text, spec_text
from tests.chaos.rig import Rig, log


@dataclass
class Config:
    kills: int = 3
    seed: int = 7
    min_load: float = 2.0  # seconds of load before a kill, drawn uniformly
    max_load: float = 12.0
    cli_kill_p: float = 0.5
    gap_op_p: float = 0.3
    workers: int = 2
    isolated: bool = True  # also a pool of isolated, memory-limited children (netns, veth, tap, cgroup)
    recover_timeout: float = 240.0  # a pool short of its target with nothing about it changing this long: stalled
    recover_cap: float = 900.0  # ... and one still changing (a slow host) is given this long in all
    start_timeout: float = 240.0  # a restarted daemon must answer within this (a niced run on a loaded host is slow)
    home: Path | None = None
    image_from: Path | None = None
    rounds: tuple[int, ...] = ()  # run only these rounds (a replay: each round's schedule depends on seed and n)
    on_round: Callable[[Report], None] | None = None  # called after every round with the report so far


@dataclass
class Round:
    n: int
    load_s: float = 0.0
    killed_cli: list[str] = field(default_factory=list)
    gap_op: bool = False
    daemon_up_s: float | None = None
    recover_s: float | None = None
    recover_note: str = ""  # why the pools were not back: stalled (for how long) or still moving at the cap
    violations: dict[str, list[str]] = field(default_factory=dict)

    @property
    def survived(self) -> bool:
        return not any(self.violations.values())


@dataclass
class Report:
    seed: int
    setup_s: float = 0.0
    rounds: list[Round] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    leaked_qemu: list[int] = field(default_factory=list)

    def violations(self, category: str) -> list[str]:
        return [f"seed {self.seed} round {r.n}: {v}" for r in self.rounds for v in r.violations.get(category, [])]

    def kills(self) -> list[Round]:
        return [r for r in self.rounds if r.n > 0]

    def recover_pct(self) -> tuple[float, float] | None:
        xs = sorted(r.recover_s for r in self.kills() if r.recover_s is not None)
        if not xs:
            return None
        return statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]

    def summary(self) -> str:
        kills = self.kills()
        survived = sum(r.survived for r in kills)
        cli = sum(len(r.killed_cli) for r in kills)
        lines = [f"chaos seed {self.seed}: {survived} of {len(kills)} daemon kills survived with every invariant "
                 f"holding ({cli} CLI processes killed with them; setup {self.setup_s:.0f} s)"]
        pct = self.recover_pct()
        if pct:
            lines.append(f"  time to recover (daemon restart -> every pool back at target): p50 {pct[0]:.1f} s, "
                         f"p90 {pct[1]:.1f} s")
        ups = sorted(r.daemon_up_s for r in kills if r.daemon_up_s is not None)
        if ups:
            lines.append(f"  daemon answering after restart: p50 {statistics.median(ups):.2f} s, max {ups[-1]:.2f} s")
        for cat in inv.CATEGORIES:
            vs = self.violations(cat)
            lines.append(f"  {cat:9s} {'OK' if not vs else f'{len(vs)} violations'}")
            lines += [f"      {v[:400]}" for v in vs[:12]]
        ops = ", ".join(f"{op} {k}: {n}" for (op, k), n in sorted(self.outcomes.items()))
        lines.append(f"  operations: {ops}")
        if self.leaked_qemu:
            lines.append(f"  QEMU processes killed by hand at the end (leaked): {self.leaked_qemu}")
        return "\n".join(lines)


class Chaos:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rig = Rig.create(cfg.home, cfg.image_from)
        self.rt = Runtime(Layout(self.rig.home))
        self.state = LoadState(isolated=cfg.isolated)
        self.load = Load(self.rig, self.state)
        self.report = Report(seed=cfg.seed)

    def run(self) -> Report:
        """Every round; the home is left in place (call close())."""
        t0 = time.monotonic()
        self.setup()
        self.report.setup_s = time.monotonic() - t0
        self.report.rounds.append(Round(0, violations=self.check()))
        for n in self.cfg.rounds or range(1, self.cfg.kills + 1):
            self.report.rounds.append(self.round(n))
            r = self.report.rounds[-1]
            log(f"round {n}: recovered in {r.recover_s} s, killed {r.killed_cli}, "
                f"violations {sum(len(v) for v in r.violations.values())}")
            for cat, vs in r.violations.items():
                for v in vs:
                    log(f"  round {n} {cat}: {v[:600]}")
            if self.cfg.on_round is not None:
                self.cfg.on_round(self.report)
        self.report.outcomes = self.state.outcomes
        self.report.errors = self.state.errors
        return self.report

    def close(self) -> None:
        self.report.leaked_qemu = self.rig.destroy()

    def setup(self) -> None:
        log(f"home {self.rig.home}: starting the daemon, building the parents, filling the pools")
        self.rig.start_daemon(self.cfg.start_timeout)
        res = self.rig.apply(spec_text(2, self.cfg.isolated))
        if res.returncode != 0:
            raise RuntimeError(f"forkd apply failed: {res.stderr[-2000:]}")
        if self.wait_pools(900.0, 900.0)[0] is None:
            raise RuntimeError(f"the pools never filled: {self.rig.pools()} {self.rig.daemon_log_tail()}")
        status, body = self.rig.http_get("/v1/objects/ForkParent/cx-p")
        self.state.parent_tag = body["items"][0]["status"]["snapshot"]

    def wait_pools(self, stall: float, cap: float) -> tuple[float | None, str]:
        """Wait until every pool is back at its target (as check_pools judges it): recovery.wait_pools."""
        return recovery.wait_pools(lambda: (self.rig.pools(), self.rt.registry.list()), stall, cap)

    def round(self, n: int) -> Round:
        rng = random.Random(f"{self.cfg.seed}:{n}")
        r = Round(n, load_s=rng.uniform(self.cfg.min_load, self.cfg.max_load))
        errors_before = len(self.state.errors)
        self.janitor()
        stop = threading.Event()
        workers = [threading.Thread(target=self.load.run, args=(random.Random(f"{self.cfg.seed}:{n}:{w}"), stop),
                                    daemon=True) for w in range(self.cfg.workers)]
        for t in workers:
            t.start()
        try:
            return self._kill_and_recover(n, rng, r, errors_before, workers, stop)
        finally:
            stop.set()  # also when interrupted (bench/chaos.py stopped early): no load thread outlives its round

    def _kill_and_recover(self, n: int, rng: random.Random, r: Round, errors_before: int,
                          workers: list[threading.Thread], stop: threading.Event) -> Round:
        time.sleep(r.load_s)
        self.rig.kill_daemon()
        for _pid, what, p in sorted(self.rig.in_flight(), key=lambda x: x[0]):
            if rng.random() < self.cfg.cli_kill_p and p.poll() is None:
                p.kill()
                r.killed_cli.append(what)
        stop.set()
        gap, gap_res = None, []
        if rng.random() < self.cfg.gap_op_p:  # a CLI build runs in-process while the daemon restarts
            r.gap_op = True
            gap = threading.Thread(target=lambda: gap_res.append(self.load.layer(rng, "gap-layer")))
            gap.start()
            time.sleep(rng.uniform(0.5, 3.0))
        r.daemon_up_s = self.rig.start_daemon(self.cfg.start_timeout)
        t_restart = time.monotonic() - r.daemon_up_s
        for t in workers + ([gap] if gap else []):
            t.join()
        left, r.recover_note = self.wait_pools(self.cfg.recover_timeout, self.cfg.recover_cap)
        r.recover_s = None if left is None else time.monotonic() - t_restart
        r.violations = self.check()
        if r.recover_note:
            r.violations["pools"] = [f"{v} ({r.recover_note})" for v in r.violations.get("pools", [])]
        r.violations["errors"] = self.state.errors[errors_before:]
        for res in gap_res:  # nobody killed it: a CLI build must survive a daemon (re)start beside it
            if res.returncode != 0:
                r.violations["errors"].append(f"an in-process `forkd snapshot diff` running while the daemon "
                                              f"restarted failed (exit {res.returncode}): {error_text(res)}")
        with self.state.lock:  # a lost child is reported once
            self.state.claimed &= {c.id for c in self.rt.registry.list()}
        return r

    def janitor(self) -> None:
        """Claimed children the load lost track of (their claim's CLI was killed after the hand-out) are killed,
        so memory stays bounded; they are not part of any invariant."""
        stray = [c.id for c in self.rt.registry.list() if c.claimed_at and c.id not in self.state.claimed]
        with self.state.lock:
            self.state.seen.update(c.id for c in self.rt.registry.list())
        if stray:
            self.rig.cli("kill", *stray, what="janitor")

    def check(self) -> dict[str, list[str]]:
        """Every invariant; a violation must persist over a second look 3 s later (a spawn or kill in flight is
        not a leak)."""
        first = self._check_once()
        if not any(first.values()):
            return first
        time.sleep(3.0)
        return self._check_once()

    def _check_once(self) -> dict[str, list[str]]:
        with self.state.lock:
            claimed, seen = set(self.state.claimed), set(self.state.seen)
        out = {"snapshots": inv.check_snapshots(self.rt), "children": inv.check_children(self.rt, claimed)}
        out["orphans"] = inv.check_orphans(self.rt, seen | {c.id for c in self.rt.registry.list()})
        try:
            out["pools"] = inv.check_pools(self.rig.pools(), self.rt.registry.list(),
                                           lambda name: ObjectStore(self.rt.layout).events("ForkPool", name))
        except OSError as exc:
            out["pools"] = [f"the daemon does not answer: {exc}"]
        out["audit"] = inv.check_audit(self.rig.home)
        return out


def run(cfg: Config) -> Report:
    chaos = Chaos(cfg)
    try:
        return chaos.run()
    finally:
        chaos.close()
        log(chaos.report.summary())


__all__ = ["POOL", "Chaos", "Config", "Report", "Round", "run"]
