"""The forkd Inspect provider's sample concurrency (`default_concurrency`) read from a real daemon's node capacity
(`forkd serve` on an empty home: no VM boots; FORKD_NODE_MEMORY_MIB sets what the node offers), and the refusal of
multi-service sample configs."""

from __future__ import annotations

import os

import pytest
from forkd_client.inspect_config import load_config
from forkd_client.inspect_provider import CHILD_MIB, ForkdSandboxEnvironment

from tests.chaos.rig import Rig


@pytest.fixture
def node(tmp_path, monkeypatch):
    """start(mib): a daemon on a fresh home whose node offers `mib` MiB; the SDK finds it through FORKD_HOME."""
    rigs: list[Rig] = []

    def start(mib: int) -> Rig:
        rig = Rig.create(home=tmp_path / f"h{mib}")
        monkeypatch.setenv("FORKD_NODE_MEMORY_MIB", str(mib))
        rig.start_daemon()
        rigs.append(rig)
        monkeypatch.delenv("FORKD_URL", raising=False)
        monkeypatch.delenv("FORKD_DAEMON_SOCKET", raising=False)
        monkeypatch.setenv("FORKD_HOME", str(rig.home))
        return rig

    yield start
    for rig in rigs:
        rig.stop_daemon()


def test_concurrency_follows_the_nodes_memory(node, monkeypatch):
    """Three samples' worth of memory gives 3 samples at once (under 2 x 8 CPUs); with 1 CPU the CPUs bound it."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    node(3 * CHILD_MIB + CHILD_MIB // 2)
    assert ForkdSandboxEnvironment.default_concurrency() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert ForkdSandboxEnvironment.default_concurrency() == 2


def test_a_full_node_still_runs_one_sample(node, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    node(CHILD_MIB // 2)
    assert ForkdSandboxEnvironment.default_concurrency() == 1


def test_without_a_daemon_the_cpus_decide(monkeypatch, tmp_path):
    """No daemon answers (port 1 refuses): twice the CPUs, not an error (Inspect asks before any sample runs)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    monkeypatch.setenv("FORKD_URL", "http://127.0.0.1:1")
    assert ForkdSandboxEnvironment.default_concurrency() == 6


@pytest.mark.parametrize("given", ["file", "dict"])
def test_several_services_per_sample_are_refused_naming_the_field(tmp_path, given):
    cfg: object = {"template": "base", "services": {"web": {"template": "a"}, "db": {"template": "b"}}}
    if given == "file":
        f = tmp_path / "forkd.yaml"
        f.write_text("template: base\nservices:\n  web: {template: a}\n  db: {template: b}\n")
        cfg = str(f)
    with pytest.raises(ValueError) as e:
        load_config(cfg)
    assert "'services'" in str(e.value) and "one VM" in str(e.value)
    if given == "file":
        assert str(tmp_path / "forkd.yaml") in str(e.value)
