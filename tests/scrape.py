"""Reading a daemon's `/metrics` in tests: the families of one scrape, and one sample's value."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, sample: str, **labels: str) -> float:
    for fam in fams.values():
        for s in fam.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {sample}{labels}")


def scraped(client, sample: str, **labels: str) -> float:
    """One sample's value, scraped now through `client` (an httpx client of the daemon)."""
    return value(families(client.get("/metrics").text), sample, **labels)
