"""The `full` image preset (bash, git, curl, CA certificates, pip, venv) and the shell a command string runs under:
`bash -l -c` where the guest has bash, as E2B runs it, else `/bin/sh -c` (the small default image)."""

from __future__ import annotations

import os
import shutil
import typing
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput
from forkd.base.presets import PRESETS, preset_packages
from forkd.core import images as core_images
from forkd.core.requests import ParentBuild, Spawn
from forkd.spec.models import DebianImage, PresetName


def test_presets_named_in_the_spec_are_the_ones_defined():
    assert set(typing.get_args(PresetName)) == set(PRESETS)
    assert {"bash", "git", "curl", "ca-certificates", "python3-pip", "python3-venv"} <= set(PRESETS["full"])
    assert "build-essential" in PRESETS["full-build"] and "build-essential" not in PRESETS["full"]


def test_preset_packages_come_first_and_once():
    assert preset_packages(None, ["jq"]) == ["jq"]
    assert preset_packages("full", ["jq", "git"]) == [*PRESETS["full"], "jq"]
    with pytest.raises(ValueError, match="unknown image preset 'huge'.*full"):
        preset_packages("huge")
    assert DebianImage.model_validate({"preset": "full", "packages": ["jq"]}).all_packages()[-1] == "jq"
    with pytest.raises(ValueError):
        DebianImage.model_validate({"preset": "huge"})


def test_unknown_preset_refused_before_any_build(rt):
    with pytest.raises(InvalidInput, match="unknown image preset"):
        core_images.ensure_image(rt, {"debian": {"preset": "huge"}})


def test_command_strings_run_under_bash_login_where_bash_exists(monkeypatch, tmp_path):
    """The guest's choice, run on the host: with bash present, `bash -l -c`; without, `/bin/sh -c`. The agent's
    modules import each other flatly (/forkd is on the guest's sys.path), so they are loaded the same way here."""
    import importlib

    from forkd.image.build import GUEST_DIR

    monkeypatch.syspath_prepend(str(GUEST_DIR))
    agent_procs = importlib.import_module("agent_procs")
    assert os.access("/bin/bash", os.X_OK)  # the host (Debian) has bash
    assert agent_procs._proc_argv({"cmd": "echo $0"}) == ["/bin/bash", "-l", "-c", "echo $0"]
    monkeypatch.setattr(agent_procs, "LOGIN_SHELL", str(tmp_path / "no-bash"))
    assert agent_procs._proc_argv({"cmd": "echo $0"}) == ["/bin/sh", "-c", "echo $0"]
    assert agent_procs._proc_argv({"argv": ["echo", "x"]}) == ["echo", "x"]  # an argv is run as given


def _run(a, cmd: str) -> tuple[str, str, int]:
    pid = a.start(cmd=cmd)
    out, err = bytearray(), bytearray()
    gen = a.stream(pid)
    try:
        while True:
            stream, data = next(gen)
            (out if stream == "stdout" else err).extend(data)
    except StopIteration as stop:
        return out.decode(), err.decode(), stop.value


DEB_CACHE = Path(os.environ.get("FORKD_TEST_DEBIAN_CACHE", "/var/lib/forkd/cache/debian"))


@pytest.mark.vm
@pytest.mark.long  # mmdebstrap of the full set and a 1 GiB disk-backed parent under TCG: minutes
@pytest.mark.timeout(2400)
def test_full_preset_has_the_toolbox_and_runs_commands_under_bash(rt):
    """`forkd image build --preset full`'s image, booted: git, pip and bash in a child, a command string run by
    `bash -l -c`. The .debs are shared across test sessions in FORKD_TEST_DEBIAN_CACHE (default
    /var/lib/forkd/cache/debian) so a rerun downloads nothing."""
    session_cache = rt.layout.cache / "debian"
    if (DEB_CACHE / "bookworm").is_dir():
        shutil.copytree(DEB_CACHE / "bookworm", session_cache / "bookworm", dirs_exist_ok=True)
    image, _ = core_images.build_debian(rt, preset_packages("full"), memory_mib=1024)
    if (session_cache / "bookworm").is_dir():
        shutil.copytree(session_cache / "bookworm", DEB_CACHE / "bookworm", dirs_exist_ok=True)
    assert set(PRESETS["full"]) <= set(image.meta["installed"])
    rt.create_snapshot(ParentBuild.of(tag="full-preset", memory_mib=1024, image_id=image.id))
    (child,) = rt.fork(Spawn.of(tag="full-preset", n=1))
    try:
        with rt.agent(child.id) as a:
            out, err, code = _run(a, "git --version && pip --version && echo \"bash=$BASH_VERSION\" && "
                                     "shopt -q login_shell && echo login")
            assert code == 0, (out, err)
            lines = out.splitlines()
            assert lines[0].startswith("git version ") and lines[1].startswith("pip "), out
            assert lines[2].startswith("bash=5.") and lines[3] == "login", out
            out, _, code = _run(a, "python3 -m venv /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.prefix)'")
            assert code == 0 and out.strip() == "/tmp/v", out
            out, _, code = _run(a, "curl --version | head -1; test -s /etc/ssl/certs/ca-certificates.crt && echo ca")
            assert out.startswith("curl ") and out.splitlines()[-1] == "ca", out
    finally:
        rt.kill([child.id])
