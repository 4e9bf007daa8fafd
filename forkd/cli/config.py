"""The CLI's view of forkd's settings: `forkd config`, and the global --log-level / --log-format options."""

from __future__ import annotations

import os

import typer

from forkd.cli.output import Fmt

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="table, json or yaml")


def config(output: Fmt = OUTPUT) -> None:
    """Every FORKD_* setting: its value in effect, default, source (env, default or invalid) and what it does.
    Secrets show only as set/unset. Exits 2 if a variable holds a value that does not parse."""
    from forkd.cli.reading import settings

    code = settings(output)
    if code:
        raise typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        from forkd import __version__

        typer.echo(f"forkd {__version__}")
        raise typer.Exit(0)


# verbs that, when a daemon answers, only read or stream through forkd.cli.daemon and log nothing: they set
# logging up only when they fall back to running in-process (setup_logging), so a daemon call imports no logging
QUIET_VERBS = frozenset({"ls", "snapshots", "exec", "logs", "version"})


def global_options(
        ctx: typer.Context,
        version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                     help="print forkd's version and exit"),
        log_level: str | None = typer.Option(None, "--log-level", help="DEBUG, INFO, WARNING (the default), ERROR; "
                                                                        "or $FORKD_LOG_LEVEL"),
        log_format: str | None = typer.Option(None, "--log-format", help="text or json (one object per line); or "
                                                                          "$FORKD_LOG_FORMAT")) -> None:
    """Set up logging for this command, and hand the choice on to the processes it starts (serve, operator)."""
    if log_level is not None or log_format is not None:
        from forkd.base.logs import FORMATS, LEVELS

        if log_level is not None and log_level.upper() not in LEVELS:
            raise typer.BadParameter(f"use one of {', '.join(LEVELS)}", param_hint="--log-level")
        if log_format is not None and log_format not in FORMATS:
            raise typer.BadParameter(f"use one of {', '.join(FORMATS)}", param_hint="--log-format")
    for name, value in (("FORKD_LOG_LEVEL", log_level), ("FORKD_LOG_FORMAT", log_format)):
        if value is not None:
            os.environ[name] = value  # declared in forkd.base.settings; read by the processes this one starts
    if ctx.invoked_subcommand not in QUIET_VERBS:
        setup_logging()


def setup_logging() -> None:
    """This command's logging, from the flags (exported above) or the environment; WARNING and text by default."""
    from forkd.base.logs import setup
    from forkd.cli.daemon import raw_env

    unset = raw_env("FORKD_LOG_LEVEL") is None, raw_env("FORKD_LOG_FORMAT") is None
    setup("WARNING" if unset[0] else None, "text" if unset[1] else None, default_level="WARNING")


def register(app: typer.Typer) -> None:
    from forkd.cli.direct import version

    app.command("version")(version)
    app.command("config")(config)
