"""The verb table (forkd.cli.verbs) and the modules that define the verbs agree both ways, so a verb cannot be
defined and unreachable, listed and missing, or listed under a stale summary. No VM, no daemon: the tree only."""

from __future__ import annotations

import functools
import importlib
import warnings

import typer
import typer.main as tm

from forkd.cli.tree import command_tree
from forkd.cli.verbs import VERBS


def _first_sentence(text: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from click.utils import make_default_short_help

        return make_default_short_help(text, 10_000)


def _registered() -> dict[str, str]:
    """verb -> module, from each module's register() (what the modules define, whatever the table says)."""
    found = {}
    for module in sorted({m for m, _ in VERBS.values()}):
        holder = typer.Typer()
        importlib.import_module(f"forkd.cli.{module}").register(holder)
        names = [i.name or tm.get_command_name(i.callback.__name__) for i in holder.registered_commands]
        names += [g.name for g in holder.registered_groups]
        for name in names:
            assert name not in found, f"{name} registered by both {found[name]} and {module}"
            found[name] = module
    return found


def test_every_registered_verb_is_in_the_table_under_its_module():
    assert _registered() == {name: module for name, (module, _) in VERBS.items()}


def test_each_summary_is_the_first_sentence_of_the_verbs_help():
    root = command_tree()
    stale = {name: (summary, _first_sentence(root.commands[name].help or ""))
             for name, (_, summary) in VERBS.items()
             if summary != _first_sentence(root.commands[name].help or "")}
    assert stale == {}


def test_a_verb_converts_alone():
    """Asking the tree for one verb converts that verb only (the others stay thunks until asked for)."""
    root = command_tree()
    assert root.commands["ls"].name == "ls"
    converted = [n for n in VERBS if not isinstance(dict.__getitem__(root.commands, n), functools.partial)]
    assert converted == ["ls"]
