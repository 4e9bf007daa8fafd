"""forkd.cli.direct parses its verbs as their typer commands do, or leaves the command line to the command tree:
its flags are the commands' own, spelling by spelling; a table of command lines parses to the same values both
ways; what it does not take whole (help, unknown flags, bad values) it leaves. No VM, no daemon: parsing only
(the part under test), against the real command tree."""

from __future__ import annotations

import click
import pytest

from forkd.cli import direct
from forkd.cli.direct import COUNT, DIRECT, DURATION, FLAG, MANY, NUMBER, OUTPUT, VALUE, WIDE
from forkd.cli.streams import docker_argv
from forkd.cli.tree import _verb, command_tree


def _kind(p: click.Option) -> str:
    if p.is_flag:
        return FLAG
    if p.multiple:
        return MANY
    if isinstance(p.type, click.Choice):
        return WIDE if "wide" in p.type.choices else OUTPUT
    if isinstance(p.type, click.types.FloatParamType):
        return NUMBER
    if isinstance(p.type, click.types.IntParamType):
        return COUNT
    return DURATION if p.name == "timeout" else VALUE


def _command(name: str) -> click.Command:
    """The tree's command for `name`: a verb, or a group's verb ("snapshot ls")."""
    first, *rest = name.split()
    cmd = _verb(first)
    for word in rest:
        cmd = cmd.commands[word]
    return cmd


def _declared(name: str) -> tuple[dict, tuple]:
    """(flag -> (parameter, kind), positional parameters) of the verb's typer command."""
    cmd = _command(name)
    flags = {o: (p.name, _kind(p)) for p in cmd.params if isinstance(p, click.Option)
             for o in (*p.opts, *p.secondary_opts)}
    args = tuple(p.name + ("*" if p.nargs == -1 else "" if p.required else "?") for p in cmd.params
                 if isinstance(p, click.Argument))
    return flags, args


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_direct_spells_the_flags_of_the_typer_command(name):
    flags, args = _declared(name)
    flags = {k: v for k, v in flags.items() if k not in ("-h", "--help")}
    assert (DIRECT[name].flags, DIRECT[name].args) == (flags, args)


def test_the_output_choices_are_the_commands():
    (opt,) = [p for p in _verb("ls").params if p.name == "output"]
    assert tuple(opt.type.choices) == direct.OUTPUTS
    (opt,) = [p for p in _verb("get").params if p.name == "output"]
    assert tuple(opt.type.choices) == direct.WIDE_OUTPUTS


def _tree_values(name: str, words: list[str]) -> dict:
    ctx = _command(name).make_context(f"forkd {name}", list(words))
    plain = {}
    for k, v in ctx.params.items():
        v = str(v) if k == "output" else v
        none = v is None and k in ("label", "env", "cmd", "egress")  # a repeatable flag not given: no values
        plain[k] = list(v) if isinstance(v, tuple | list) else [] if none else v
    return plain


LINES = [
    ["version"], ["ls"], ["ls", "-o", "json"], ["ls", "--output=yaml"], ["ls", "-ojson"],
    ["ls", "-l", "a=b", "--label", "c", "--label=d=e", "-lf"], ["snapshots", "-o", "table"],
    ["snapshot", "ls", "-o", "json"],
    ["logs", "c1"], ["logs", "-f", "c1"], ["logs", "c1", "--follow"],
    ["exec", "c1", "true"], ["exec", "c1", "--", "ls", "-l", "--help"], ["exec", "-it", "c1", "sh"],
    ["exec", "-ie", "A=1", "-e", "B=2=3", "--env=C=", "c1", "--", "env"],
    ["exec", "-w", "/tmp", "--cwd=/", "-u", "0", "--timeout", "1m30s", "c1", "pwd"],
    ["exec", "--workdir", "/x", "--user=nobody", "--timeout=90", "c1", "--", "-"], ["exec", "c1", "--"],
    ["config"], ["config", "-o", "yaml"], ["snapshot", "info", "t1"], ["snapshot-info", "-ojson", "t1"],
    ["snapshot", "rm", "t1"], ["snapshot", "rm", "--force", "--cascade", "t1"], ["rmi", "-f", "t1"],
    ["get", "pools"], ["get", "pool", "p", "-o", "wide"], ["get", "pool/p", "-n", "ns", "-oyaml"],
    ["get", "-A", "pools", "--all-namespaces", "--output=json"], ["describe", "pool/p"],
    ["describe", "--namespace", "ns", "pool/p"], ["ping", "c1"], ["eval", "c1", "1+1"],
    ["eval", "--timeout", "5m", "c1", "x", "-o", "json"], ["kill"], ["kill", "c1", "c2"], ["kill", "--all"],
    ["kill", "--tag=t1"], ["gc"], ["gc", "--dry-run", "--grace", "5"], ["gc", "--grace=0.5", "-o", "json"],
    ["audit", "verify"], ["fork", "--tag", "t1"], ["fork", "-t", "t1", "--count", "3", "-o", "json"],
    ["fork", "--tag=t1", "-n", "2", "--timeout", "2m", "--per-child-netns", "--memory-limit-mib", "256"],
    ["fork", "--tag", "t1", "--egress", "10.0.0.0/8:5432", "--egress=192.0.2.7:80", "--prime", "true"],
    ["fork", "--from-sandbox", "c1", "--keep", "--allow-unconstrained", "--egress", "internet"],
]


@pytest.mark.parametrize("argv", LINES, ids=" ".join)
def test_direct_parses_a_command_line_as_the_tree_does(argv):
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in DIRECT else argv[0]
    words = argv[len(name.split()):]
    if name == "exec":
        words = docker_argv(words)
    got = direct.parse(DIRECT[name], list(words))
    if "output" in got:
        got["output"] = got["output"] or "table"  # the runners' default, as the command's
    assert got == _tree_values(name, words)


@pytest.mark.parametrize("argv", [
    ["ls", "--help"], ["ls", "-h"], ["exec", "--help"], ["ls", "--lable", "x"], ["ls", "-o", "wide"],
    ["ls", "-o"], ["ls", "extra"], ["logs"], ["logs", "-fx", "c1"], ["logs", "--follow=yes", "c1"],
    ["exec", "--timeout", "soon", "c1", "true"], ["exec", "-z", "c1", "true"], ["exec"],
    ["--log-level", "DEBUG", "ls"], ["fork", "--help"], ["snapshot", "ls", "--help"], ["snapshot"],
    ["snapshot", "info"], ["get", "pools", "-o", "name"], ["get"], ["get", "a", "b", "c"], ["gc", "--grace", "1e3"],
    ["gc", "--grace", "-1"], ["gc", "--grace", "."], ["eval", "c1"], ["eval", "c1", "x", "--timeout", "soon"],
    ["kill", "--al"], ["fork", "--tag", "t1", "--count", "0"], ["fork", "--tag", "t1", "--count", "x"],
    ["fork", "--tag", "t1", "--memory-limit-mib", "-5"], ["fork", "--tag", "t1", "--timeout", "1e3"],
    ["ping"], ["ping", "c1", "c2"], ["describe", "pool/p", "-A"], ["audit"], ["config", "x"],
], ids=" ".join)
def test_what_direct_does_not_take_whole_goes_to_the_tree(argv):
    assert direct.run(list(argv)) is None


def test_shell_completion_goes_to_the_tree(monkeypatch):
    """click answers completion from an empty command line and the words in the environment."""
    monkeypatch.setenv("_FORKD_COMPLETE", "bash_complete")
    assert direct.run([]) is None and direct.run(["ls"]) is None


def test_forkd_alone_prints_the_help_on_stderr_and_exits_2_as_the_tree_did(capsys):
    assert direct.run([]) == 2
    assert capsys.readouterr().err == direct.root_help()


def test_root_help_lists_the_root_options_and_every_verb():
    root = command_tree()
    spelled = {o for p in root.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    listed = {s.split(" ")[0].rstrip(",") for n, _ in direct.ROOT_OPTIONS for s in n.split(", ")}
    assert listed == spelled
    text = direct.root_help(78)
    assert all(f"\n  {name} " in text for name in root.commands if not root.commands[name].hidden)
    assert not any(f"\n  {name} " in text for name in root.commands if root.commands[name].hidden)
    ctx = click.Context(root, info_name="forkd")
    assert root.get_help(ctx) + "\n" == direct.root_help()  # one help text, whichever way it is reached
