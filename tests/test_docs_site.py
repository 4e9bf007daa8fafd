"""The docs site is generated from the code: the CLI reference lists every visible command of the one command
tree with its options, and `mkdocs build --strict` (MkDocs + mkdocstrings over docs/) passes. No VM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.cli.main import app
from forkd.cli.reference import markdown
from forkd.cli.tree import command_tree

ROOT = Path(__file__).resolve().parent.parent


def _visible(cmd, path: str):
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        if not sub.hidden:
            yield f"{path} {name}", sub
            yield from _visible(sub, f"{path} {name}")


def test_the_cli_reference_has_every_command_and_option():
    text = markdown(app)
    commands = list(_visible(command_tree(app), "forkd"))
    assert len(commands) > 30
    for path, cmd in commands:
        assert f"`{path}`" in text, path
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden and p.name != "help":
                assert f"`{p.opts[0]}`" in text, (path, p.opts)


def test_hidden_spellings_stay_out_of_the_reference():
    """Old spellings (hidden aliases) work but are not documented: the reference shows the current grammar."""
    text = markdown(app)
    hidden = [n for n, c in command_tree(app).commands.items() if c.hidden]
    for name in hidden:
        assert f"## `forkd {name}`" not in text, name


@pytest.mark.skipif(not (ROOT / "mkdocs.yml").exists(), reason="mkdocs.yml is the repository's")
def test_the_site_builds_strictly(tmp_path):
    """Without `-q`: a quiet build does not count its warnings, so `--strict` would let them through."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0 and "WARNING" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert (tmp_path / "repository" / "SECURITY" / "index.html").exists()  # a page's link outside docs/ is served
    cli = (tmp_path / "cli-reference" / "index.html").read_text()
    assert "forkd exec" in cli and "--interactive" in cli
    assert "Sandbox" in (tmp_path / "api-reference" / "index.html").read_text()
