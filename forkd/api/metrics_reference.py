"""The metrics reference (docs/metrics.md), generated from forkd.api.metrics: `python -m forkd.api.metrics_reference`
prints it; tests/test_reference_pages.py checks the committed page is current.

The state gauges are built at scrape time from the daemon's control; here they are collected over an empty one
(no snapshots, children or pools), which yields every family with its name, help and labels."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.metrics import MetricWrapperBase

from forkd.api.metrics import Metrics, _StateCollector
from forkd.base import telemetry
from forkd.base.mdtable import cell

INTRO = """# Metrics reference

<!-- generated: `python -m forkd.api.metrics_reference > docs/metrics.md`; tests/test_reference_pages.py -->

`GET /metrics` (Prometheus text format; `forkd/api/metrics.py`). Names follow Prometheus conventions (base units,
counters end in `_total`); labels take only few values (`pool`, `status`, `reason`, `kind`, `action`, `mode`,
`residency`, and the API's `method`, `route`, `status`), never a snapshot tag or a child id, and a `pool` label
only ever names a pool that exists. Events (histograms, counters) are observed as they happen, through
`forkd/base/telemetry.py` for the core and the reconciler; states (gauges) are read from disk at each scrape, as is
the idle loop's pass count (`forkd_sweeps_total`) from the daemon's runtime.
"""

_SUFFIX = {"counter": "_total", "info": "_info"}


def _events() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(name as scraped, type, labels, help) of the metrics the daemon observes."""
    metrics = Metrics()
    try:
        out = []
        for m in list(metrics.registry._collector_to_names):  # prometheus_client keeps no public list
            if not isinstance(m, MetricWrapperBase):
                continue
            labels = tuple(m._labelnames)
            if m._type == "info":  # an info's labels are its keys
                labels = tuple(next(iter(m.collect())).samples[0].labels)
            out.append((m._name + _SUFFIX.get(m._type, ""), m._type, labels, m._documentation))
        return out
    finally:
        telemetry.unsubscribe(metrics)


def _states() -> list[tuple[str, str, tuple[str, ...], str]]:
    rt = SimpleNamespace(snapshots=list, children=list, store=None, sweeps=0)
    empty = SimpleNamespace(rt=rt, get=lambda kind: [])
    return [(f.name + _SUFFIX.get(f.type, ""), f.type, tuple(getattr(f, "_labelnames", ())), f.documentation)
            for f in _StateCollector(empty).collect()]


def page() -> str:
    rows = ["| metric | type | labels | what |", "| --- | --- | --- | --- |"]
    for name, typ, labels, doc in sorted(_events() + _states()):
        rows.append(f"| `{name}` | {typ} | {', '.join(labels)} | {cell(doc)} |")
    return INTRO + "\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(page(), end="")
