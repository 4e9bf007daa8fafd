"""The verb table (forkd.cli.verbs) and the modules that define the verbs agree both ways, so a verb cannot be
defined and unreachable, listed and missing, or listed under a stale summary. No VM, no daemon: the tree only."""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings

import typer
import typer.main as tm

from forkd.cli.tree import command_tree
from forkd.cli.verbs import OLD_NOUNS, VERBS


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
    listed = {name: module for name, (module, _) in VERBS.items()}
    assert _registered() == {**listed, **{old: module for old, (module, _) in OLD_NOUNS.items()}}


def test_the_snapshot_verbs_are_grouped_and_their_old_spellings_hidden_aliases():
    """`forkd snapshot ls|info|rm|diff|compact`; each old top-level spelling runs the same command, hidden from
    --help, and is not listed among the verbs."""
    root = command_tree()
    group = root.commands["snapshot"]
    for old, (_, new) in OLD_NOUNS.items():
        alias = root.commands[old]
        assert alias.hidden and old not in VERBS, old
        assert inspect.unwrap(alias.callback) is inspect.unwrap(group.commands[new].callback), (old, new)
        assert [p.name for p in alias.params] == [p.name for p in group.commands[new].params], (old, new)


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
