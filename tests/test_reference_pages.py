"""The reference pages generated from the code are current: docs/spec.md (the spec models), docs/settings.md (the
settings model) and docs/metrics.md (the daemon's metrics) are what their generators print now, and each page
names every item of its source. No VM, no daemon."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from forkd.base.settings import Settings, env_name
from forkd.spec.models import KINDS

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = {"spec.md": "forkd.spec.reference", "settings.md": "forkd.base.settings_reference",
         "metrics.md": "forkd.api.metrics_reference"}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_committed_page_is_what_its_generator_prints(name):
    page = importlib.import_module(PAGES[name]).page()
    assert (DOCS / name).read_text() == page, f"docs/{name} is stale: python -m {PAGES[name]} > docs/{name}"


def test_the_pages_name_every_kind_setting_and_metric():
    spec, settings = (DOCS / "spec.md").read_text(), (DOCS / "settings.md").read_text()
    assert all(f"## {kind}\n" in spec for kind in KINDS)
    assert all(f"| `{env_name(f)}` |" in settings for f in Settings.model_fields)
    metrics = (DOCS / "metrics.md").read_text()
    for name in ("forkd_spawn_seconds", "forkd_requests_total", "forkd_build_info", "forkd_sandboxes_residency",
                 "forkd_pool_warm", "forkd_snapshot_chain_depth"):
        assert f"| `{name}` |" in metrics, name
