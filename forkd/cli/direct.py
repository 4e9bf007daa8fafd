"""The verbs `forkd` runs before its command tree is built, with the standard library alone: `forkd --help` and
the verbs that read, stream or make one call through a daemon (version, config, ls, snapshot ls/info/rm, get,
describe, exec, logs, ping, eval, fork, kill, gc, audit verify). They start without typer and click, which cost most of
the rest of a start.

`DIRECT` spells each of these verbs' flags as its typer command declares them (tests/test_cli_direct.py checks
that the two agree, flag by flag, and parse a table of command lines to the same values). A command line this
parser does not take whole (a flag it does not know, a global option, `--help`, a bad value, a missing argument)
goes to the command tree, which runs it or says what is wrong in its own words: the errors and each verb's help
stay the tree's.
"""

from __future__ import annotations

import importlib
import os
import sys

TYPE_CHECKING = False  # typing's own flag, without importing typing
if TYPE_CHECKING:
    from typing import Any

OUTPUTS = ("table", "json", "yaml")  # forkd.cli.output.Fmt
WIDE_OUTPUTS = ("table", "wide", "yaml", "json")  # forkd.cli.declarative.GetOut
# kinds of flag: a bool, one value, a repeatable value, a duration (seconds, as forkd.cli.options.duration_value
# gives them), a plain decimal number (a float), a count (an int, 1 or more), an output format (OUTPUTS; WIDE:
# WIDE_OUTPUTS)
FLAG, VALUE, MANY, DURATION, NUMBER, COUNT = "flag", "value", "many", "duration", "number", "count"
OUTPUT, WIDE = "output", "wide"
_NUMBER = "0123456789."


class Verb:
    """One verb: `run` ("module:function" under forkd.cli) gets the parsed values as keywords and returns an exit
    code (None: 0); `flags` maps each spelling to (parameter, kind); `args` are the positional parameters, in
    order, the last one ending in `*` taking every word after the others, one ending in `?` optional (None);
    `defaults`: a flag's value when not given, where the command's is not None, False or []. (A plain class:
    dataclasses would import inspect, which costs more than the rest of this module.)"""

    __slots__ = ("run", "flags", "args", "defaults")

    def __init__(self, run: str, flags: dict[str, tuple[str, str]], args: tuple[str, ...] = (),
                 defaults: dict[str, Any] | None = None):
        self.run, self.flags, self.args, self.defaults = run, flags, args, defaults or {}


def _spell(param: str, kind: str, *names: str) -> dict[str, tuple[str, str]]:
    return {n: (param, kind) for n in names}


_OUT = _spell("output", OUTPUT, "-o", "--output")
_NS = _spell("namespace", VALUE, "-n", "--namespace")
_INFO = Verb("calls:snapshot_info", _OUT, ("tag",))
_RM = Verb("calls:snapshot_rm", {**_spell("force", FLAG, "--force"), **_spell("force_old", FLAG, "-f"),
                                 **_spell("cascade", FLAG, "--cascade")}, ("tag",))
DIRECT: dict[str, Verb] = {
    "version": Verb("direct:version", {}),
    "config": Verb("reading:settings", _OUT),
    "ls": Verb("reading:children", {**_spell("label", MANY, "-l", "--label"), **_OUT}),
    "snapshot ls": Verb("reading:snapshots", _OUT),
    "snapshots": Verb("reading:snapshots", _OUT),  # the old spelling (forkd.cli.verbs.OLD_NOUNS), warned
    "snapshot info": _INFO, "snapshot-info": _INFO, "snapshot rm": _RM, "rmi": _RM,  # and their old spellings
    "get": Verb("objects:get", {**_spell("output", WIDE, "-o", "--output"), **_NS,
                                **_spell("all_namespaces", FLAG, "-A", "--all-namespaces")}, ("resource", "name?")),
    "describe": Verb("objects:describe", _NS, ("ref",)),
    "ping": Verb("calls:ping", {}, ("child",)),
    "eval": Verb("calls:eval_", {**_OUT, **_spell("timeout", DURATION, "--timeout")}, ("child", "code"),
                 {"timeout": 60.0}),
    "fork": Verb("calls:fork", {**_spell("tag", VALUE, "-t", "--tag"),
                                **_spell("from_sandbox", VALUE, "--from-sandbox"),
                                **_spell("keep", FLAG, "--keep"), **_spell("n", COUNT, "--count"),
                                **_spell("n_old", COUNT, "-n"), **_spell("timeout", DURATION, "--timeout"),
                                **_spell("per_child_netns", FLAG, "--per-child-netns"),
                                **_spell("memory_limit_mib", COUNT, "--memory-limit-mib"),
                                **_spell("egress", MANY, "--egress"),
                                **_spell("allow_unconstrained", FLAG, "--allow-unconstrained"),
                                **_spell("prime", MANY, "--prime"), **_OUT}, defaults={"n": 1, "timeout": 60.0}),
    "kill": Verb("calls:kill", {**_spell("all_", FLAG, "--all"), **_spell("tag", VALUE, "--tag")}, ("ids*",)),
    "gc": Verb("calls:gc", {**_spell("dry_run", FLAG, "--dry-run"), **_spell("grace", NUMBER, "--grace"), **_OUT},
               defaults={"grace": 60.0}),
    "audit verify": Verb("calls:audit_verify", {}),
    "logs": Verb("streams:run_logs", _spell("follow", FLAG, "-f", "--follow"), ("child",)),
    "exec": Verb("streams:exec_code", {**_spell("interactive", FLAG, "-i", "--interactive"),
                                       **_spell("tty", FLAG, "-t", "--tty"), **_spell("env", MANY, "-e", "--env"),
                                       **_spell("cwd", VALUE, "-w", "--workdir", "--cwd"),
                                       **_spell("user", VALUE, "-u", "--user"),
                                       **_spell("timeout", DURATION, "--timeout")}, ("child", "cmd*")),
}


def _warn_old_spelling(name: str) -> None:
    """The warning forkd.cli.options.old_spelling prints, for a verb spelled the old way."""
    from forkd.cli.verbs import OLD_NOUNS

    if name in OLD_NOUNS:
        new = f"forkd snapshot {OLD_NOUNS[name][1]}"
        sys.stderr.write(f"warning: `forkd {name}` is the old spelling of `{new}`; it still works, but use `{new}`\n")


class Unparsed(Exception):
    """This command line is the command tree's to parse (or to refuse)."""


def parse(verb: Verb, words: list[str]) -> dict[str, Any]:
    """The values of `words` (what follows the verb) as the verb's typer command would parse them, with its
    defaults for what is not given; Unparsed for anything but a plain, valid command line."""
    values: dict[str, Any] = {p: [] if k == MANY else False if k == FLAG else None for p, k in verb.flags.values()}
    values.update(verb.defaults)
    positional: list[str] = []
    words = list(words)  # a cluster of short flags is split in place
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            positional += words[i:]
            break
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        name, eq, inline = word.partition("=") if word.startswith("--") else (word[:2], "", word[2:])
        if name not in verb.flags:
            raise Unparsed(word)
        param, kind = verb.flags[name]
        if kind == FLAG:
            if eq:
                raise Unparsed(word)
            values[param] = True
            if inline:  # a cluster of short flags: -it
                words.insert(i, "-" + inline)
            continue
        if not eq and not inline:
            if i == len(words):
                raise Unparsed(word)  # the tree says the flag needs a value
            inline, i = words[i], i + 1
        values[param] = _value(kind, inline, values[param])
    return _positional(verb, positional, values)


def _value(kind: str, text: str, old: Any) -> Any:
    if kind == MANY:
        return [*old, text]
    if (kind == OUTPUT and text not in OUTPUTS) or (kind == WIDE and text not in WIDE_OUTPUTS):
        raise Unparsed(text)
    if kind == COUNT:  # 1 or more, as plain digits: anything else is the tree's to read or refuse
        if not text.isdigit() or not text.isascii() or text.startswith("0"):
            raise Unparsed(text)
        return int(text)
    if kind == NUMBER:  # plain decimals only: anything else is the tree's to read or refuse
        if not text or text.strip(_NUMBER) or text.count(".") > 1 or text == ".":
            raise Unparsed(text)
        return float(text)
    if kind == DURATION:
        from forkd.base.durations import parse_duration

        try:
            return parse_duration(text)
        except ValueError:
            raise Unparsed(text) from None
    return text


def _positional(verb: Verb, words: list[str], values: dict[str, Any]) -> dict[str, Any]:
    for name in verb.args:
        if name.endswith("*"):
            values[name[:-1]], words = list(words), []
        elif name.endswith("?"):
            values[name[:-1]], words = (words[0], words[1:]) if words else (None, words)
        elif not words:
            raise Unparsed(name)  # a missing argument: the tree names it
        else:
            values[name], words = words[0], words[1:]
    if words:
        raise Unparsed(words[0])
    return values


def run(argv: list[str]) -> int | None:
    """Run `argv` here if it is `--help` or one of DIRECT's verbs, parsed whole; its exit code, or None to leave
    it to the command tree."""
    if "_FORKD_COMPLETE" in os.environ:  # shell completion (click's): the tree answers it
        return None
    if argv in (["--help"], ["-h"]):
        sys.stdout.write(root_help())
        return 0
    if not argv:  # as click's no_args_is_help: the help on stderr, and a usage error's code
        sys.stderr.write(root_help())
        return 2
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in DIRECT else argv[0]
    verb = DIRECT.get(name)
    if verb is None:
        return None
    words = argv[len(name.split()):]
    if argv[0] == "exec":
        from forkd.cli.streams import docker_argv

        words = docker_argv(words)
    try:
        values = parse(verb, words)  # -h and --help are no flags of DIRECT's: the tree answers them
    except Unparsed:
        return None
    _warn_old_spelling(name)
    module, func = verb.run.split(":")
    return guarded(lambda: getattr(importlib.import_module(f"forkd.cli.{module}"), func)(**values))


def version() -> None:
    """Print forkd's version."""
    from forkd import __version__

    sys.stdout.write(f"{__version__}\n")


def guarded(call: Any) -> int:
    """Run `call`; its exit code, forkd's own errors printed as every verb prints them (forkd.cli.main's codes)."""
    try:
        code = call()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as exc:
        from forkd.base.errors import ForkdError  # imported when needed: `forkd version` needs none

        if isinstance(exc, ForkdError):
            fail(exc.message, exc.hint)
            return exc.exit_code
        if isinstance(exc, OSError):  # an environment problem forkd did not anticipate: say what, no traceback
            fail(str(exc), None)
            return 1
        raise
    return code if isinstance(code, int) else 0


def fail(message: str, hint: str | None) -> None:
    """An error on stderr, plain (scripts read these lines too)."""
    sys.stderr.write(f"error: {message}\n" + (f"hint: {hint}\n" if hint else ""))


HELP = ("forkd: copy-on-write microVM sandboxes. Boot a parent once, snapshot it warm, fork children in "
        "milliseconds.\n\nState lives in $FORKD_HOME (default /var/lib/forkd). Commands go to the daemon named "
        "by $FORKD_URL (+ $FORKD_TOKEN), else to the one answering on $FORKD_HOME/forkd.sock, else run in-process "
        "(FORKD_NO_DAEMON=1 forces that).")
# the root's options as its help lists them (forkd.cli.config.global_options, typer's completion, click's help;
# tests/test_cli_direct.py checks these against the root command)
ROOT_OPTIONS = [
    ("--version", "print forkd's version and exit"),
    ("--log-level TEXT", "DEBUG, INFO, WARNING (the default), ERROR; or $FORKD_LOG_LEVEL"),
    ("--log-format TEXT", "text or json (one object per line); or $FORKD_LOG_FORMAT"),
    ("--install-completion", "Install completion for the current shell."),
    ("--show-completion", "Show completion for the current shell, to copy it or customize the installation."),
    ("-h, --help", "Show this message and exit."),
]


def root_help(width: int | None = None) -> str:
    """`forkd --help`: usage, what forkd is, the root's options, every verb with its summary (forkd.cli.verbs)."""
    import shutil
    import textwrap

    from forkd.cli.verbs import VERBS

    width = width or max(min(shutil.get_terminal_size().columns, 80) - 2, 50)
    lines = ["Usage: forkd [OPTIONS] COMMAND [ARGS]...", ""]
    for para in HELP.split("\n\n"):
        lines += textwrap.wrap(para, width, initial_indent="  ", subsequent_indent="  ") + [""]
    lines += ["Options:", *_rows(ROOT_OPTIONS, width), "", "Commands:"]
    lines += _rows([(name, summary) for name, (_, summary) in VERBS.items()], width, shorten=True)
    return "\n".join(lines) + "\n"


def _rows(rows: list[tuple[str, str]], width: int, shorten: bool = False) -> list[str]:
    """Two columns: names, then their text wrapped beside them (or cut to one line, ending in '...')."""
    import textwrap

    first = min(max(len(n) for n, _ in rows), 30) + 4
    out = []
    for name, text in rows:
        room = max(width - first, 20)
        if shorten and len(text) > room:
            text = text[:room - 3].rsplit(" ", 1)[0] + "..."
        wrapped = textwrap.wrap(text, room) or [""]
        head = f"  {name}".ljust(first)
        if len(name) + 2 > first - 2:
            out.append(f"  {name}")
            head = " " * first
        out += [head + wrapped[0], *(" " * first + w for w in wrapped[1:])]
    return out
