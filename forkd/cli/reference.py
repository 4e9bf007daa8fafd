"""The CLI reference as Markdown, written from the command tree itself (the docs site's `reference/cli.md`)."""

from __future__ import annotations

from typing import Any

from forkd.base.mdtable import cell
from forkd.base.mdtable import text as _text
from forkd.cli.tree import command_tree


def _param_row(p: Any) -> str:
    names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts]) if p.param_type_name == "option" \
        else f"`{p.metavar or p.name.upper()}`"
    help_ = cell(getattr(p, "help", None) or "")
    default = p.default if p.param_type_name == "option" and p.default not in (None, False, [], ()) else None
    if default is not None and not callable(default):
        help_ += f" (default: `{getattr(default, 'value', default)}`)"
    return f"| {names} | {help_} |"


def _command(cmd: Any, path: str, level: int) -> list[str]:
    doc = _text((cmd.help or "").strip())
    lines = [f"{'#' * level} `{path}`", "", doc, ""] if doc else [f"{'#' * level} `{path}`", ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False) and p.name not in ("help",)]
    if params:
        lines += ["| argument or option | what it does |", "|---|---|", *(_param_row(p) for p in params), ""]
    if cmd.epilog:
        lines += [_text(" ".join(cmd.epilog.split())), ""]
    sub = getattr(cmd, "commands", None)
    for name in sorted(sub or {}):
        child = sub[name]
        if not child.hidden:
            lines += _command(child, f"{path} {name}", min(level + 1, 4))
    return lines


def markdown(app: Any = None) -> str:
    """Every visible command of `forkd`, its help, arguments and options, in the tree's order."""
    root = command_tree() if app is None else command_tree(app)
    lines = ["# CLI reference", "", "Generated from the command definitions (`forkd/cli/`); `forkd COMMAND --help` "
             "prints the same.", "", _text(" ".join((root.help or "").split())), "", "## Global options", "",
             "| option | what it does |", "|---|---|",
             *(_param_row(p) for p in root.params if not getattr(p, "hidden", False)), ""]
    for name in sorted(root.commands):
        cmd = root.commands[name]
        if not cmd.hidden:
            lines += _command(cmd, f"forkd {name}", 2)
    return "\n".join(lines).rstrip() + "\n"
