"""Prometheus metrics at GET /metrics (prometheus_client, one registry per app).

Events (histograms, counters) are observed by the routes; states (pools, snapshots, children) are read from disk at
scrape time by a collector, so they are never stale and cost nothing between scrapes. Names follow Prometheus
conventions (base units, `_bytes`, `_seconds`; counters end in `_total`; no per-snapshot or per-child label: only
`pool`, `status`, `reason`, `kind`, `action`, `mode`, whose values are few). Two gauges keep upstream's names as
aliases although a gauge should not end in `_total`: `forkd_snapshots_total` (= sum of `forkd_snapshots`) and
`forkd_sandboxes_active` (= `forkd_sandboxes{status="running"}`); `forkd_build_info` too.

A `pool` label only ever names a pool that exists (a claim of a name that is no pool is counted under pool ""), and
the series of a deleted pool are dropped at the next scrape: no client can grow the series. A failed claim is
counted in `forkd_claim_failures_total`, not timed with the claims that handed out children.
"""

from __future__ import annotations

import contextlib
import platform
import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from forkd import __version__
from forkd.base import telemetry
from forkd.reconciler.objects import key
from forkd.service.children import RESIDENCY

if TYPE_CHECKING:
    from forkd.reconciler.control import Control

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


POOLED = {"spawn": ("pool", "reason"), "claim": ("pool",), "claim_failed": ("pool", "reason"),
          "reconcile_action": ("action", "pool")}  # the label names, in order, of the events labelled by pool
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
CHILD_STATES = ("running", "starting", "stopping", "dead", "oom-killed", "failed")


def _depths(snaps: list) -> list[int]:
    known = {x.tag: x for x in snaps}
    out = []
    for s in snaps:
        d, cur = 0, s
        while cur.parent_tag and d < 256:
            d += 1
            cur = known.get(cur.parent_tag)
            if cur is None:
                break
        out.append(d)
    return out


def _depth_histogram(depths: list[int]) -> HistogramMetricFamily:
    """Chain depths as a histogram with no per-tag label: one series per bucket however many branches exist."""
    buckets = [(floatToGoString(b), sum(1 for d in depths if d <= b)) for b in DEPTH_BUCKETS] + [("+Inf", len(depths))]
    return HistogramMetricFamily("forkd_snapshot_chain_depth", "layers between a snapshot and its base",
                                 buckets=buckets, sum_value=sum(depths))


def _residency(running: list):
    """Running children by residency (awake, paged out, asleep: forkd.sandbox.child) and their wakes so far."""
    by_res = GaugeMetricFamily("forkd_sandboxes_residency", "running children by residency (awake: in RAM; paged: "
                               "its VMM's memory in swap; asleep: vCPUs stopped)", labels=["residency"])
    for res in RESIDENCY:
        by_res.add_metric([res], sum(1 for c in running if c.residency == res))
    yield by_res
    yield GaugeMetricFamily("forkd_sandbox_wakes", "requests that resumed a running child or paged it back in, "
                            "summed over the running children", value=sum(c.wakes for c in running))


class _StateCollector:
    def __init__(self, control: Control):
        self.control = control

    def collect(self):
        rt = self.control.rt
        snaps = [s for s in rt.snapshots() if hasattr(s, "status")]
        by_status = GaugeMetricFamily("forkd_snapshots", "snapshots by status", labels=["status"])
        for st in ("writing", "ready", "failed"):
            by_status.add_metric([st], sum(1 for s in snaps if s.status == st))
        yield by_status
        yield GaugeMetricFamily("forkd_snapshots_total", "alias of sum(forkd_snapshots) kept for upstream "
                                "dashboards (a gauge despite its name)", value=len(snaps))
        depths = _depths(snaps)
        yield _depth_histogram(depths)
        yield GaugeMetricFamily("forkd_snapshot_chain_depth_max", "deepest snapshot chain",
                                value=max(depths, default=0))
        yield GaugeMetricFamily("forkd_snapshot_stored_bytes", "bytes allocated on disk by snapshots",
                                value=self._stored(rt, snaps))
        yield from self._children(rt.children())
        yield from self._pools()
        yield CounterMetricFamily("forkd_sweeps", "passes of the node's idle loop (lifetimes, throw-away branch "
                                  "snapshots, idle page-out) since the daemon started: one that stops growing "
                                  "enforces no lifetime", value=rt.sweeps)

    @staticmethod
    def _stored(rt, snaps) -> int:
        stored = 0
        for s in snaps:
            try:
                stored += sum(p.stat().st_blocks * 512 for p in rt.store.dir(s.tag).iterdir() if p.is_file())
            except OSError:
                pass
        return stored

    @staticmethod
    def _children(children):
        statuses = [c.status for c in children]
        yield GaugeMetricFamily("forkd_sandboxes_active", "alias of forkd_sandboxes{status=\"running\"} kept "
                                "for upstream dashboards", value=statuses.count("running"))
        yield GaugeMetricFamily("forkd_vmm_processes", "VMM processes alive",
                                value=sum(1 for c in children if c.alive))
        by_state = GaugeMetricFamily("forkd_sandboxes", "children by status", labels=["status"])
        for st in CHILD_STATES:
            by_state.add_metric([st], statuses.count(st))
        yield by_state
        by_pool = GaugeMetricFamily("forkd_pool_children", "children by pool and status (pool \"\": no pool)",
                                    labels=["pool", "status"])
        counts: dict[tuple[str, str], int] = {}
        for c in children:
            key = (c.pool or "", c.status)
            counts[key] = counts.get(key, 0) + 1
        for (pool, st), n in sorted(counts.items()):
            by_pool.add_metric([pool, st], n)
        yield by_pool
        yield from _residency([c for c, st in zip(children, statuses, strict=True) if st == "running"])

    def _pools(self):
        warm = GaugeMetricFamily("forkd_pool_warm", "idle warm children per pool", labels=["pool"])
        claimed = GaugeMetricFamily("forkd_pool_claimed", "claimed children per pool", labels=["pool"])
        target = GaugeMetricFamily("forkd_pool_target", "warm children wanted per pool", labels=["pool"])
        for obj in self.control.get("ForkPool"):  # pool: the qualified name (ns.name), as children carry it
            st, pool = obj.status, key(obj)
            warm.add_metric([pool], st.warm if st else 0)
            claimed.add_metric([pool], st.claimed if st else 0)
            target.add_metric([pool], st.target if st else obj.spec.warm)
        yield warm
        yield claimed
        yield target


class Metrics:
    """One registry per app. Latencies come from forkd.base.telemetry (the core and the reconciler report every
    spawn, claim, exec and reconcile there, whichever path ran them); this object subscribes to it."""

    def __init__(self, control: Control | None = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.spawn_seconds = Histogram("forkd_spawn_seconds", "child restore to first agent answer, every path "
                                       "(reason: direct, refill by the reconciler, claim forking on the spot)",
                                       ["pool", "reason"], buckets=LATENCY_BUCKETS, registry=r)
        self.spawn_request_seconds = Histogram("forkd_spawn_request_seconds", "POST /v1/sandboxes until all answer",
                                               buckets=LATENCY_BUCKETS, registry=r)
        self.claim_seconds = Histogram("forkd_claim_seconds", "claim of children from a pool (API, CLI, operator)",
                                       ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.exec_seconds = Histogram("forkd_exec_seconds", "one command or code run in a child",
                                      ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.reconcile_seconds = Histogram("forkd_reconcile_seconds", "one reconcile step (plan, inline actions, "
                                           "statuses)", buckets=LATENCY_BUCKETS, registry=r)
        self.reconcile_action_seconds = Histogram("forkd_reconcile_action_seconds", "one action of the reconciler",
                                                  ["action", "pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.branch_pause_seconds = Histogram("forkd_branch_pause_seconds", "time the branch source was paused",
                                              ["mode"], buckets=PAUSE_BUCKETS, registry=r)
        self.claim_failures = Counter("forkd_claim_failures", "claims that failed, by pool (\"\": the name given "
                                      "was no pool) and error kind", ["pool", "reason"], registry=r)
        self.errors = Counter("forkd_errors", "API errors by kind", ["kind", "status"], registry=r)
        self.requests = Counter("forkd_requests", "API requests", ["method", "route", "status"], registry=r)
        build = Info("forkd_build", "build information (upstream: forkd_build_info)", registry=r)
        build.info({"version": __version__, "python": platform.python_version(), "api": "v1"})
        self._events = {"spawn": self.spawn_seconds, "claim": self.claim_seconds, "exec": self.exec_seconds,
                        "reconcile": self.reconcile_seconds, "reconcile_action": self.reconcile_action_seconds}
        self._counts = {"claim_failed": self.claim_failures}
        self._pooled: dict[str, set[tuple[str, tuple[str, ...]]]] = {}  # pool -> (event, label values) observed
        self._lock = threading.Lock()
        self.control = control
        if control is not None:
            r.register(_StateCollector(control))
        telemetry.subscribe(self)

    def observe(self, event: str, seconds: float, labels: dict[str, str]) -> None:
        """A telemetry observation (see forkd.base.telemetry); unknown events are ignored."""
        metric = self._events.get(event) or self._counts.get(event)
        if metric is None:
            return
        child = metric.labels(**labels) if labels else metric
        child.inc() if event in self._counts else child.observe(seconds)
        if labels.get("pool"):
            with self._lock:
                self._pooled.setdefault(labels["pool"], set()).add(
                    (event, tuple(labels[n] for n in POOLED.get(event, ()))))

    def _forget_gone_pools(self) -> None:
        """Drop the series of pools that no longer exist: a label names only a pool the daemon has."""
        if self.control is None:
            return
        existing = {key(o) for o in self.control.get("ForkPool")}
        with self._lock:
            gone = [p for p in self._pooled if p not in existing]
            for pool in gone:
                for event, values in self._pooled.pop(pool):
                    with contextlib.suppress(KeyError, ValueError):
                        (self._events.get(event) or self._counts[event]).remove(*values)

    def render(self) -> bytes:
        self._forget_gone_pools()
        return generate_latest(self.registry)
