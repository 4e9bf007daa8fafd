"""The flags every forkd command spells the same way (kubectl's grammar), in one place.

    -o, --output FORMAT   always an output format (table, json, yaml; get also name and wide)
    -f, --filename PATH   always an input file (apply, delete, diff, quickstart)
    -n, --namespace NS    reserved for namespaces (the operator's --namespace); counts are --count
    --output-dir DIR      where a command writes files (crds, schema); --output-file FILE for one file (pack)
    --timeout DURATION    one duration format everywhere: 90 (seconds), 90s, 5m, 1h30m (forkd.base.durations)
    --dry-run             client|server where both exist (apply); a plain flag where only one does (gc)

Old spellings keep working, hidden from --help, and print a warning saying the new one: `-n N` for --count,
`rmi -f` for --force, `-o PATH` in pack/crds/schema for --output-file/--output-dir, `pack --json` for -o json."""

from __future__ import annotations

from typing import Any

import typer

from forkd.base.durations import EXAMPLES, parse_duration
from forkd.base.errors import ForkdError
from forkd.cli.output import Fmt, old_spelling  # noqa: F401 - old_spelling: here too, beside the flags

OUTPUT = typer.Option(Fmt.table, "-o", "--output", help="output format: table, json or yaml")


def duration_value(value: Any) -> float | None:
    """Checked while the command line is parsed, before anything is done (bad value: exit 2)."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a duration: use {EXAMPLES}") from None


def timeout_option(default: str | None, what: str) -> Any:
    """--timeout DURATION (the function receives seconds, a float)."""
    return typer.Option(default, "--timeout", callback=duration_value, metavar="DURATION",
                        help=f"{what} ({EXAMPLES})")


MAX_LIFETIME_S = 30 * 86400.0  # the daemon's bound on a client-given lifetime (forkd.client.wire)


def _lifetime(value: Any) -> float | None:
    secs = duration_value(value)
    if secs is not None and not 0 < secs <= MAX_LIFETIME_S:
        raise typer.BadParameter(f"{value!r}: a lifetime is more than 0 and at most 30 days")
    return secs


def lifetime_option(what: str) -> Any:
    """--lifetime DURATION (seconds, a float, in (0, 30 days]); None when not given."""
    return typer.Option(None, "--lifetime", callback=_lifetime, metavar="DURATION", help=f"{what} ({EXAMPLES})")


def egress_raw(values: list[str] | None) -> Any:
    """forkd.cli.calls.egress_json, refusing as a command-line parameter (exit 2)."""
    from forkd.cli.calls import egress_json

    try:
        return egress_json(values)
    except ForkdError as exc:
        raise typer.BadParameter(exc.message) from None


def egress_from(values: list[str] | None) -> Any:
    """--egress none | internet | CIDR:port (repeat for several): the typed egress, None when not given (bad
    value: exit 2)."""
    value = egress_raw(values)
    if value is None:
        return None
    from forkd.client import parse_egress

    try:
        return parse_egress(value, "--egress")
    except ForkdError as exc:
        raise typer.BadParameter(exc.message) from None


def egress_option() -> Any:
    """--egress (repeatable); None when not given."""
    return typer.Option(None, "--egress", callback=lambda v: egress_from(v) and v, metavar="POLICY",
                        help="what each child may reach on the network (isolated snapshots only): none (the "
                             "default), internet (public IPv4 only: never metadata, private ranges or the host), "
                             "or CIDR:port (repeat for an allow list of exactly those, e.g. --egress "
                             "10.0.0.0/8:5432); IPv6 never. With --from-sandbox, unset keeps the source's")


def count_option(default: int, what: str) -> Any:
    return typer.Option(default, "--count", min=1, help=what)


OLD_COUNT = typer.Option(None, "-n", hidden=True, help="old spelling of --count")


def count(value: int, old: int | None) -> int:
    """--count, or the old `-n N` (warned)."""
    if old is not None:
        old_spelling("-n N", "--count N")
        return old
    return value


def format_or_old_path(value: str | None, new: str) -> tuple[Fmt | None, str | None]:
    """`-o` is a format; in the commands where it once named a file or directory, a value that is not a format
    is taken as that path (the old spelling, warned). Returns (format, path)."""
    if value is None:
        return None, None
    if value in Fmt.__members__:
        return Fmt(value), None
    old_spelling(f"-o {value}", f"{new} {value}")
    return None, value


# -- shell completion (forkd --install-completion): names asked of the daemon, or the home, at TAB time ----------
def _names(fetch: Any, incomplete: str) -> list[str]:
    try:
        return sorted(n for n in fetch() if n.startswith(incomplete))
    except Exception:  # noqa: BLE001 - a completion never fails the shell: no daemon, no home, no names
        return []


def complete_children(incomplete: str) -> list[str]:
    from forkd.cli.daemon import backend

    return _names(lambda: [c["id"] for c in backend().children()], incomplete)


def complete_snapshots(incomplete: str) -> list[str]:
    from forkd.cli.daemon import backend

    return _names(lambda: [s["tag"] for s in backend().snapshots()], incomplete)


def complete_pools(incomplete: str) -> list[str]:
    from forkd.cli.daemon import backend

    return _names(lambda: [o.metadata.name for o in backend().get("ForkPool")], incomplete)


CHILD = typer.Argument(..., help="child id", autocompletion=complete_children)
SNAPSHOT = typer.Argument(..., help="snapshot tag", autocompletion=complete_snapshots)
