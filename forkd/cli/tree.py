"""The `forkd` command tree: the root group and its global options, each verb imported from its module
(forkd.cli.verbs) and converted from its typer definition only when it is asked for. A verb loads its own module
alone; `forkd --help` lists the verbs from the table and loads none; the reference and completion load all."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import click
import typer
import typer.core
import typer.main as tm

from forkd.cli import config
from forkd.cli.direct import HELP, fail, root_help
from forkd.cli.verbs import OLD_NOUNS, VERBS


class Root(typer.core.TyperGroup):
    """The root group: its help is forkd.cli.direct's (the verbs listed from the table, none loaded)."""

    def get_help(self, ctx: click.Context) -> str:
        return root_help().rstrip("\n")


app = typer.Typer(cls=Root, help=HELP, no_args_is_help=True, pretty_exceptions_enable=False, add_completion=True,
                  rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})
app.callback()(config.global_options)


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


@functools.cache
def _registered(module: str) -> typer.Typer:
    """The verbs `forkd.cli.<module>` registers, on a typer app of their own (each module registered once)."""
    holder = typer.Typer()
    importlib.import_module(f"forkd.cli.{module}").register(holder)
    return holder


def _verb(name: str) -> click.Command:
    """The click command of one verb, converted from its module's typer definition."""
    holder = _registered(VERBS[name][0] if name in VERBS else OLD_NOUNS[name][0])
    opts = {"pretty_exceptions_short": app.pretty_exceptions_short, "rich_markup_mode": app.rich_markup_mode}
    for info in holder.registered_commands:
        if (info.name or tm.get_command_name(info.callback.__name__)) == name:
            return tm.get_command_from_info(info, **opts)
    for group in holder.registered_groups:
        if group.name == name:
            return tm.get_group_from_info(group, suggest_commands=app.suggest_commands, **opts)
    raise LookupError(f"forkd.cli's register() adds no verb {name!r}: fix forkd/cli/verbs.py")


def command_tree(root: typer.Typer = app) -> Any:
    """The click group of `root` (the `forkd` app), its verbs converted lazily."""
    group = tm.get_command(root)
    group.commands = LazyCommands({name: functools.partial(_verb, name) for name in [*VERBS, *OLD_NOUNS]})
    return group


def main() -> None:
    """The `forkd` entry point: parse, run one verb, exit with its code (forkd.cli.main says which codes)."""
    from forkd.base.errors import ForkdError

    # httpx imports its own command line (rich, click's extras, pygments) when it is imported, unless that import
    # fails: no verb runs httpx's command line, so a verb that reaches the daemon through the SDK skips it
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    argv = sys.argv[1:]
    if argv == ["--version"]:  # answered before the tree is built (the tree's eager --version says the same)
        from forkd import __version__

        sys.stdout.write(f"forkd {__version__}\n")
        return
    exec_failed = None
    if argv[:1] == ["exec"]:
        from forkd.cli import streams

        argv, exec_failed = ["exec", *streams.docker_argv(argv[1:])], streams.EXEC_FAILED
    try:
        code = command_tree().main(args=argv, prog_name="forkd", standalone_mode=False)
    except click.ClickException as exc:  # bad usage: the flag and why
        exc.show()
        sys.exit(exec_failed or exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except ForkdError as exc:
        fail(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except OSError as exc:  # an environment problem forkd did not anticipate: say what, without a traceback
        fail(str(exc), None)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
