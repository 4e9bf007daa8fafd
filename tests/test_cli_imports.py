"""The CLI's start-up import graph stays small: a verb imports what it needs, never the in-process runtime, the
reconciler, the spec models or the SDK's API models when a daemon answers (the import graph, not the clock, so the
test means the same on a loaded host). No VM: the daemon here is tests.http_stub's loopback server, which answers
the few routes these verbs call; the part under test is the CLI process's own imports, not the daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkd import cli
from forkd.cli.verbs import OLD_NOUNS, VERBS
from tests.http_stub import Draining, serving

# what a verb that talks to a daemon must not load: the in-process side of forkd and its big dependencies
IN_PROCESS = ("forkd.core", "forkd.reconciler", "forkd.vmm", "forkd.store", "forkd.image", "forkd.api",
              "forkd.operator", "forkd.client.local", "forkd.spec.models", "forkd.spec.loader", "jinja2")
# what a verb's --help must not load either: no HTTP client, no API models
NO_CLIENT = (*IN_PROCESS, "httpx", "forkd_client.api", "forkd.client.http", "yaml")
# and `forkd --help`: not even the settings (pydantic); `forkd --version`: not even the command tree (typer)
NO_BACKEND = (*NO_CLIENT, "forkd.base.settings", "pydantic")
NO_TREE = (*NO_BACKEND, "typer", "click", "rich")
# what a verb through the daemon must not load: the settings model (pydantic), httpx, the SDK's API client and
# models (RemoteBackend sends over forkd.cli.daemon.Sender; only a verb whose own request or answer is a model loads
# pydantic)
NO_HEAVY_CLIENT = (*IN_PROCESS, "forkd.base.settings", "pydantic", "httpx", "forkd_client.api",
                   "forkd_client.models", "forkd.service.wire")
# nor the standard library's HTTP client and what it brings (email, ssl), nor logging (set up only in-process)
NO_STDLIB_CLIENT = ("http.client", "email", "ssl", "logging")
# nor rich (tables, messages and each verb's --help are plain); logging is set up by the tree's verbs (config)
NO_HEAVY_CLIENT = (*NO_HEAVY_CLIENT, *NO_STDLIB_CLIENT[:-1], "rich", "pygments")
# the verbs forkd.cli.direct runs: not the command tree either, nor logging
NO_TREE_CLIENT = (*NO_HEAVY_CLIENT, "logging", "typer", "click", "forkd.cli.tree")
# exec and logs: the same, also when they fail
NO_PRINTER = NO_TREE_CLIENT


# modules a verb's module may draw on besides its own: the root's global options (config), the snapshot group's
# callback (forkd.cli.main's `snapshot` is branch's `snapshot --from-sandbox`)
DRAWS_ON = {None: {"config"}, "main": {"config", "branch"}}


def other_verbs(verb: str | None) -> tuple[str, ...]:
    """The modules of every verb but `verb` (forkd.cli.verbs): running a verb imports its own module alone."""
    own = (VERBS.get(verb) or OLD_NOUNS[verb])[0] if verb else None
    allowed = {own} | DRAWS_ON.get(own, DRAWS_ON[None])
    return tuple(sorted({f"forkd.cli.{m}" for m, _ in VERBS.values() if m not in allowed}))

PROBE = ("import json, os, sys\n"
         "sys.argv = ['forkd', *json.loads(os.environ['PROBE_ARGV'])]\n"
         "from forkd.cli import main\n"
         "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\nelse:\n    code = 0\n"
         "with open(os.environ['PROBE_OUT'], 'w') as f:\n"
         "    json.dump({'code': code, 'modules': sorted(m for m, v in sys.modules.items() if v is not None)}, f)\n")


def loaded(argv: list[str], tmp_path, **env: str) -> tuple[int, list[str]]:
    """Run the `forkd` entry point with `argv` in a fresh interpreter; its exit code and every module it loaded."""
    out = tmp_path / "modules.json"
    e = dict(os.environ, PROBE_ARGV=json.dumps(argv), PROBE_OUT=str(out), FORKD_HOME=str(tmp_path / "home"), **env)
    e.pop("FORKD_NO_DAEMON", None)
    subprocess.run([sys.executable, "-c", PROBE], env=e, capture_output=True, timeout=120, check=True)
    res = json.loads(out.read_text())
    return res["code"], res["modules"]


def heavy(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == b or m.startswith(b + ".") for b in banned)]


class Answering(Draining):
    busy = 0  # answers at once


POOL = (b'{"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "p", "namespace": "default"}, '
        b'"spec": {"from": "t1", "warm": 1}}')
GC = json.dumps({k: [] for k in ("adopted", "reaped", "processes", "netns", "veths", "leases", "cgroups", "dirs",
                                 "memory_files", "temporaries", "overlay_templates")} | {"leftovers": 0}).encode()


# what importing the CLI (every module of forkd.cli, and what a verb imports to reach a daemon) must not load:
# each verb imports what it needs when it runs, so a module-level import of any of these fails here
CLI_MODULES = sorted(f"forkd.cli.{p.stem}" for p in (Path(cli.__file__).parent).glob("*.py"))
ON_THE_WAY = ("forkd.client", "forkd.client.remote", "forkd.client.http", "forkd_client.http", "forkd.base.errors")
NOT_AT_IMPORT = (*IN_PROCESS, "pydantic", "httpx", "forkd.base.settings", "forkd_client.api", "forkd_client.models",
                 "forkd.service.wire", "forkd.core.requests", "yaml", "rich", "pygments", "http.client", "email",
                 "ssl", "logging", "asyncio")


def test_importing_the_cli_loads_nothing_heavy():
    """The import graph of the fast path: the command tree, every verb's module and the daemon client."""
    probe = ("import importlib, json, sys\n"
             f"for m in {[*CLI_MODULES, *ON_THE_WAY]!r}:\n    importlib.import_module(m)\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(got.stdout)
    assert "forkd.cli.tree" in modules and "forkd.client.remote" in modules and "typer" in modules  # it did look
    assert heavy(modules, NOT_AT_IMPORT) == []


@pytest.mark.parametrize("argv,banned", [
    (["--version"], NO_TREE), (["version"], (*NO_TREE, "logging", "forkd.cli.tree", *other_verbs("version"))),
    (["--help"], (*NO_TREE, "logging", "forkd.cli.tree", *other_verbs(None))),  # the verbs from the table alone
    (["exec", "--help"], (*NO_CLIENT, "rich", "http.client", "email", "ssl", *other_verbs("exec"))),  # click's
    (["fork", "--help"], (*NO_CLIENT, "rich")), (["apply", "--help"], (*NO_CLIENT, "rich", *other_verbs("apply")))])
def test_version_and_help_load_no_backend(argv, banned, tmp_path):
    code, modules = loaded(argv, tmp_path)
    assert code == 0
    assert heavy(modules, banned) == []


@pytest.mark.parametrize("argv,path,answer", [
    (["ls"], "/v1/children", b"[]"),
    (["snapshot", "ls"], "/v1/snapshots", b"[]"),
    (["snapshots"], "/v1/snapshots", b"[]"),  # the old spelling, as fast
    (["ls", "-o", "json"], "/v1/children", b"[]"),
    (["logs", "cnosuch"], "/v1/children/cnosuch/logs", b'{"data": "", "offset": 0}'),
    (["exec", "cnosuch", "true"], "/v1/children/cnosuch/processes", b'{"type": "exit", "exit_code": 0}'),
    # run by forkd.cli.direct, through RemoteBackend over the CLI's own transport
    (["get", "pools"], "/v1/pools", b"[]"),  # kind names from forkd.spec.kinds, documents as the daemon sends them
    (["get", "pool/p", "-o", "json"], "/v1/pools/p", POOL),
    (["describe", "pool/p"], "/v1/pools/p/describe", b'{"object": %s, "events": []}' % POOL),
    (["ping", "c1"], "/v1/children/c1/ping", b'{"pong": true}'),
    (["eval", "c1", "1"], "/v1/children/c1/eval", b'{"result": "1", "error": null, "stdout": ""}'),
    (["fork", "--tag", "t1"], "/v1/children", b'{"children": []}'),  # the daemon checks the request
    (["fork", "--tag", "t1", "--egress", "10.0.0.0/8:5432"], "/v1/children", b'{"children": []}'),
    (["gc", "--dry-run"], "/v1/gc", GC),
    (["snapshot", "info", "t1"], "/v1/snapshots/t1/info", b"{}"),
    (["snapshot-info", "t1"], "/v1/snapshots/t1/info", b"{}"),
    (["snapshot", "rm", "t1"], "/v1/snapshots/t1/delete", b'{"deleted": ["t1"]}'),
    (["rmi", "t1"], "/v1/snapshots/t1/delete", b'{"deleted": ["t1"]}'),
    (["kill", "c1"], "/v1/children/kill", b'{"killed": [["c1", true]]}'),
    (["audit", "verify"], "/v1/audit/verify", b'{"ok": true, "text": "OK"}'),
])
def test_a_verb_through_a_daemon_loads_no_in_process_runtime(argv, path, answer, tmp_path):
    with serving(Answering) as url:
        Answering.answers = {path: ("application/json", answer)}
        code, modules = loaded(argv, tmp_path, FORKD_URL=url)
    posts = ("exec", "rmi", "kill", "ping", "eval", "fork", "gc")
    method = "POST" if argv[0] in posts or argv[:2] == ["snapshot", "rm"] else "GET"
    assert Answering.seen.get((method, path)) == 1, Answering.seen  # it did ask the daemon
    assert code == 0
    banned = {"exec": NO_PRINTER, "logs": NO_PRINTER}.get(argv[0], NO_TREE_CLIENT) + other_verbs(argv[0])
    assert heavy(modules, banned) == []


@pytest.mark.parametrize("argv,code", [(["exec", "c1", "true"], 125), (["logs", "c1"], 6)])
def test_a_failing_stream_verb_loads_no_printer(argv, code, tmp_path):
    """A daemon named by FORKD_URL that nothing answers: the error (exit 125 for exec, as docker's) is printed
    without rich or the heavy client."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    got, modules = loaded(argv, tmp_path, FORKD_URL=dead)
    assert got == code
    assert heavy(modules, (*NO_PRINTER, *other_verbs(argv[0]))) == []


def test_without_a_daemon_the_in_process_runtime_is_loaded(tmp_path):
    """The other side of the rule, so the check above cannot pass by loading nothing: no daemon, `forkd ls` runs
    in-process and does load the runtime."""
    code, modules = loaded(["ls"], tmp_path, FORKD_NO_DAEMON="1")
    assert code == 0
    assert "forkd.core.runtime" in modules and "forkd.client.local" in modules


def test_config_reads_the_settings_without_their_model(tmp_path):
    """`forkd config` reads a plain environment with forkd.cli.settings_table; a value only the model reads (a log
    in exponent notation) loads the model, and the command still answers."""
    code, modules = loaded(["config", "-o", "json"], tmp_path, FORKD_ACCEL="tcg", FORKD_RETRY_WAIT="0.5")
    assert code == 0
    assert heavy(modules, (*NO_TREE_CLIENT, *other_verbs("config"))) == []
    code, modules = loaded(["config", "-o", "json"], tmp_path, FORKD_RETRY_WAIT="1e-3")
    assert code == 0 and "forkd.base.settings" in modules
