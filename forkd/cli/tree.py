"""The command tree click runs: typer's group for `app`, each command converted from its definition only when it
is asked for (a verb converts itself alone; `--help` and completion convert all)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
import typer.main as tm


class LazyCommands(dict):
    """name -> click command, each made by its thunk on first access."""

    def __getitem__(self, name: str) -> Any:
        value = super().__getitem__(name)
        if isinstance(value, functools.partial):
            value = value()
            super().__setitem__(name, value)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> Any:
        return [self[k] for k in self]

    def items(self) -> Any:
        return [(k, self[k]) for k in self]


def _thunks(app: typer.Typer) -> dict[str, Callable[[], Any]]:
    opts = {"pretty_exceptions_short": app.pretty_exceptions_short, "rich_markup_mode": app.rich_markup_mode}
    made: dict[str, Callable[[], Any]] = {}
    for info in app.registered_commands:
        name = info.name or tm.get_command_name(info.callback.__name__)
        made[name] = functools.partial(tm.get_command_from_info, info, **opts)
    for group in app.registered_groups:
        name = group.name if isinstance(group.name, str) else None
        if name is None:
            raise ValueError("every group added to the forkd CLI is named (add_typer(..., name=...))")
        made[name] = functools.partial(tm.get_group_from_info, group, suggest_commands=app.suggest_commands, **opts)
    return made


def command_tree(app: typer.Typer) -> Any:
    """typer.main.get_command(app), with its commands converted lazily."""
    shell = typer.Typer()
    shell.info, shell.registered_callback = app.info, app.registered_callback
    shell.pretty_exceptions_short, shell.rich_markup_mode = app.pretty_exceptions_short, app.rich_markup_mode
    shell._add_completion = app._add_completion
    group = tm.get_command(shell)
    group.commands = LazyCommands(_thunks(app))
    return group
