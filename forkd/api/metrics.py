"""Prometheus metrics at GET /metrics (prometheus_client, one registry per app).

Events (histograms, counters) are observed by the routes; states (pools, snapshots, children) are read from disk at
scrape time by a collector, so they are never stale and cost nothing between scrapes. Upstream's stable names
(`forkd_snapshots_total`, `forkd_sandboxes_active`, `forkd_build_info`) are kept.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily

from forkd import __version__

if TYPE_CHECKING:
    from forkd.reconciler.control import Control

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


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
        yield GaugeMetricFamily("forkd_snapshots_total", "registered snapshots (upstream name)", value=len(snaps))
        depth = GaugeMetricFamily("forkd_snapshot_chain_depth", "layers between a snapshot and its base",
                                  labels=["tag"])
        stored = 0
        for s in snaps:
            d = 0
            cur = s
            known = {x.tag: x for x in snaps}
            while cur.parent_tag and d < 256:
                d += 1
                cur = known.get(cur.parent_tag)
                if cur is None:
                    break
            depth.add_metric([s.tag], d)
            try:
                stored += sum(p.stat().st_blocks * 512 for p in rt.store.dir(s.tag).iterdir() if p.is_file())
            except OSError:
                pass
        yield depth
        yield GaugeMetricFamily("forkd_snapshot_bytes_stored", "bytes allocated on disk by snapshots",
                                value=stored)
        children = rt.children()
        statuses = [c.status for c in children]
        yield GaugeMetricFamily("forkd_sandboxes_active", "children whose VMM runs (upstream name)",
                                value=statuses.count("running"))
        yield GaugeMetricFamily("forkd_vmm_processes", "VMM processes alive (running children)",
                                value=sum(1 for c in children if c.alive))
        by_state = GaugeMetricFamily("forkd_sandboxes", "children by status", labels=["status"])
        for st in ("running", "starting", "dead", "failed"):
            by_state.add_metric([st], statuses.count(st))
        yield by_state
        warm = GaugeMetricFamily("forkd_pool_warm", "idle warm children per pool", labels=["pool"])
        claimed = GaugeMetricFamily("forkd_pool_claimed", "claimed children per pool", labels=["pool"])
        target = GaugeMetricFamily("forkd_pool_target", "warm children wanted per pool", labels=["pool"])
        for obj in self.control.get("ForkPool"):
            st = obj.status
            warm.add_metric([obj.metadata.name], st.warm if st else 0)
            claimed.add_metric([obj.metadata.name], st.claimed if st else 0)
            target.add_metric([obj.metadata.name], st.target if st else obj.spec.warm)
        yield warm
        yield claimed
        yield target


class Metrics:
    def __init__(self, control: Control | None = None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.spawn_seconds = Histogram("forkd_spawn_seconds", "child restore to first agent answer",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.spawn_request_seconds = Histogram("forkd_spawn_request_seconds", "POST /v1/sandboxes until all answer",
                                               buckets=LATENCY_BUCKETS, registry=r)
        self.claim_seconds = Histogram("forkd_claim_seconds", "claim of warm children from a pool",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.branch_pause_seconds = Histogram("forkd_branch_pause_seconds", "time the branch source was paused",
                                              ["mode"], buckets=PAUSE_BUCKETS, registry=r)
        self.errors = Counter("forkd_errors", "API errors by kind", ["kind", "status"], registry=r)
        self.requests = Counter("forkd_requests", "API requests", ["method", "route", "status"], registry=r)
        build = Info("forkd_build", "build information (upstream: forkd_build_info)", registry=r)
        build.info({"version": __version__, "python": platform.python_version(), "api": "v1"})
        if control is not None:
            r.register(_StateCollector(control))

    def render(self) -> bytes:
        return generate_latest(self.registry)
