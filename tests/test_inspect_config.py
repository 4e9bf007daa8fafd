"""The forkd Inspect provider's config (forkd_client.inspect_config), no VMs: a YAML file or an object, refusals
that name what is wrong (unknown keys, Docker files, pool with setup, relative workdir, oversized files), equal
configs sharing one per-task template, and the entry point Inspect loads."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from forkd_client.inspect_config import MAX_CONFIG, ForkdSandboxConfig, load_config, slug


def test_a_yaml_file_and_the_defaults(tmp_path):
    f = tmp_path / "forkd.yaml"
    f.write_text("template: py\nsetup:\n  - adduser -D agent\nuser: agent\nworkdir: /home/agent\n")
    cfg = load_config(str(f))
    assert (cfg.template, cfg.setup, cfg.user, cfg.workdir) == ("py", ("adduser -D agent",), "agent", "/home/agent")
    assert load_config(None) == ForkdSandboxConfig() and ForkdSandboxConfig().source == "snapshot base"
    assert load_config({"pool": "agents"}).source == "pool agents"
    assert cfg.key() == load_config(str(f)).key() != ForkdSandboxConfig().key()


@pytest.mark.parametrize(("text", "says"), [
    ("image: python:3.12\n", "image"),
    ("template: a\npool: b\n", "not both"),
    ("pool: b\nsetup: [echo]\n", "setup"),
    ("workdir: home\n", "absolute"),
    ("- a\n- b\n", "mapping"),
])
def test_bad_files_are_refused_naming_the_file(tmp_path, text, says):
    f = tmp_path / "forkd.yaml"
    f.write_text(text)
    with pytest.raises(ValueError) as e:
        load_config(str(f))
    assert str(f) in str(e.value) and says in str(e.value)


def test_docker_files_and_huge_files_are_refused(tmp_path):
    compose = tmp_path / "compose.yaml"
    compose.write_text("services: {}\n")
    with pytest.raises(ValueError, match="does not read Docker files"):
        load_config(str(compose))
    big = tmp_path / "big.yaml"
    big.write_text("#" * (MAX_CONFIG + 1))
    with pytest.raises(ValueError, match="over"):
        load_config(str(big))
    with pytest.raises(ValueError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(TypeError, match="services"):
        load_config(42)


def test_slugs_are_tags():
    assert slug("My Task/v2 (hard)") == "my-task-v2-hard"
    assert slug("///") == "task" and len(slug("x" * 100)) == 40


def test_the_entry_point_registers_the_provider():
    """What Inspect does to find `sandbox="forkd"`: load the `inspect_ai` entry points, then look it up."""
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    [ep] = [e for e in entry_points(group="inspect_ai") if e.name == "forkd_client"]
    ep.load()
    assert registry_find_sandboxenv("forkd").__name__ == "ForkdSandboxEnvironment"
