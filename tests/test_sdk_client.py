"""forkd-client (sdk/python), the light Python client: it imports neither the runtime nor yaml nor zstandard; an
unreachable daemon is Unavailable after bounded retries (503 retried for idempotent requests only); and, against a
real daemon on the fake VMM driver (tests/fake_vmm.py), sandboxes (create/list/connect, envs, streaming and
background commands, files, eval, typed errors), the async client, and upstream's client surface
(forkd_client.compat) unchanged."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import forkd_client
import pytest
from forkd_client import (  # sdk/python
    AsyncSandbox,
    Client,
    CommandExitException,
    NotFound,
    Retry,
    Sandbox,
    Unavailable,
    compat,
)

from tests.conftest import BASE_TAG, WARM_GLOBAL
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.http_stub import Draining, serving
from tests.test_api import free_port, start_api_daemon, stop_api_daemon

REPO = Path(__file__).resolve().parent.parent


def test_import_loads_neither_the_runtime_nor_yaml_nor_zstandard():
    """What `import forkd_client` adds to what httpx and pydantic (its only dependencies) load themselves."""
    code = ("import sys, httpx, pydantic; before = set(sys.modules); import forkd_client, forkd_client.compat; "
            "new = set(sys.modules) - before; "
            "print(sorted(m for m in new if m.split('.')[0] in ('yaml', 'zstandard', 'forkd')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    meta = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.requires('forkd-client'))"],
                          capture_output=True, text=True, timeout=60)
    required = [r for r in eval(meta.stdout) if "extra ==" not in r]  # optional extras (inspect) aside
    assert sorted(r.split(">")[0] for r in required) == ["httpx", "pydantic"]


def test_one_sdk_and_one_error_hierarchy():
    """forkd.sdk is forkd_client (the same objects), and forkd.base.errors' kinds are forkd_client.errors' (the same
    classes, with the runtime's exit codes and HTTP statuses): `except NotFound` catches either's. Before, each had
    its own copies (a NotFound of one was not a NotFound of the other) and forkd_client's Sandbox lacked most of
    forkd.sdk's (files.list, set_timeout, fork)."""
    import forkd_client.errors as ce

    import forkd.base.errors as fe
    import forkd.sdk

    for name in ("Controller", "AsyncController", "Sandbox", "AsyncSandbox", "ControllerError", "SandboxInfo"):
        assert getattr(forkd.sdk, name) is getattr(forkd_client, name), name
    kinds = {"ForkdError": (1, 500), "InvalidInput": (2, 400), "NotFound": (3, 404), "Conflict": (4, 409),
             "Timeout": (5, 504), "Unavailable": (6, 503), "ProtocolViolation": (1, 502)}
    for name, (code, status) in kinds.items():
        cls = getattr(fe, name)
        assert cls is getattr(ce, name) and (cls.exit_code, cls.http_status) == (code, status), name
    with pytest.raises(fe.NotFound):
        raise ce.api_error(404, {"detail": "no such sandbox", "hint": "list them"}, "http://d/v1/sandboxes/x")
    assert issubclass(fe.TerminalError, ce.ForkdError)
    for method in ("list", "exists", "get_info", "remove", "rename", "make_dir", "chmod", "watch_dir"):
        assert callable(getattr(Sandbox(None, None).files, method)), method  # type: ignore[arg-type]
    assert all(callable(getattr(Sandbox, m)) for m in ("set_timeout", "fork", "list", "connect"))


def test_e2b_command_errors_carry_the_result():
    """What E2B code catches: CommandExitException (exit_code, stdout, stderr, error) for a non-zero exit,
    TimeoutException for a command its timeout killed; both ForkdErrors; check=False returns the result."""
    from forkd_client import ForkdError, SandboxException, Timeout, TimeoutException
    from forkd_client.commands import CommandResult, checked

    ok = CommandResult(exit_code=0, stdout_bytes=b"fine")
    assert checked(ok, True, 5, "cmd") is ok
    bad = CommandResult(exit_code=3, stdout_bytes=b"out", stderr_bytes=b"boom\n")
    with pytest.raises(CommandExitException) as e:
        checked(bad, True, 5, "cmd")
    assert (e.value.exit_code, e.value.stdout, e.value.stderr, e.value.result) == (3, "out", "boom\n", bad)
    assert "exited with code 3: boom" in str(e.value) and isinstance(e.value, SandboxException)
    slow = CommandResult(exit_code=-9, timed_out=True, stdout_bytes=b"partial")
    with pytest.raises(TimeoutException) as t:
        checked(slow, True, 1.5, "cmd")
    assert isinstance(t.value, Timeout) and isinstance(t.value, ForkdError) and t.value.stdout == "partial"
    assert "1.5 s" in str(t.value)
    assert checked(bad, False, 5, "cmd") is bad and checked(slow, False, 1.5, "cmd") is slow


def test_readme_typescript_example_parses_on_this_node(tmp_path):
    """The reference's TypeScript example (docs/reference.md) is valid syntax on the Node here (the package claims
    Node >= 18): no `await using` outside a comment, which Node before 24 rejects."""
    if shutil.which("node") is None:
        pytest.skip("needs node")
    text = (REPO / "docs" / "reference.md").read_text()
    start = text.index("TypeScript (`sdk/typescript`, Node >= 18")
    block = [ln[4:] for ln in text[start:].split("\n\n", 2)[1].splitlines() if ln.startswith("    ")]
    assert any("Sandbox.create" in ln for ln in block), block
    (tmp_path / "example.mjs").write_text("\n".join(block) + "\n")
    res = subprocess.run(["node", "--check", str(tmp_path / "example.mjs")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_fallback_error_names_every_place_tried(monkeypatch, tmp_path):
    """No url/socket, no FORKD_URL, no socket at the home: the client falls back to upstream's address, and an
    error reaching it names the places tried before it too (built from a refused connect: no traffic)."""
    import httpx
    from forkd_client.http import DEFAULT_URL, find_daemon, transport_error

    monkeypatch.delenv("FORKD_URL", raising=False)
    monkeypatch.delenv("FORKD_DAEMON_SOCKET", raising=False)
    monkeypatch.setenv("FORKD_HOME", str(tmp_path))
    ep = find_daemon()
    assert ep.base_url == DEFAULT_URL and ep.socket is None
    msg = str(transport_error(httpx.ConnectError("refused"), ep, "GET", "/v1/sandboxes", tries=4))
    for place in (DEFAULT_URL, "$FORKD_URL: not set", str(tmp_path / "forkd.sock"), "url=/socket="):
        assert place in msg, msg
    monkeypatch.setenv("FORKD_DAEMON_SOCKET", str(tmp_path / "named.sock"))
    assert str(tmp_path / "named.sock") in str(transport_error(httpx.ConnectError("x"), find_daemon(), "GET"))
    assert find_daemon(url="http://d:1").tried == ()  # named explicitly: nothing else was tried


def test_an_unreachable_daemon_is_unavailable_after_retries():
    port = free_port()  # nothing listens there
    with pytest.raises(Unavailable) as e:
        Client(url=f"http://127.0.0.1:{port}", retry=Retry(attempts=3, first_wait=0.01)).list_sandboxes()
    assert e.value.status is None and "3 attempt(s)" in str(e.value) and e.value.hint


class _Flaky(Draining):
    """Answers 503 to the first two requests of each method, then 200."""

    busy = 2


def test_503_is_retried_for_idempotent_requests_only():
    with serving(_Flaky) as url:
        c = Client(url=url, retry=Retry(attempts=4, first_wait=0.01))
        assert c.list_sandboxes() == []  # GET: two 503s, then the answer
        assert _Flaky.seen["GET", "/v1/sandboxes"] == 3
        with pytest.raises(Unavailable) as e:  # POST: may have done part of its work, so never sent again
            c.spawn_sandboxes("x")
        assert _Flaky.seen["POST", "/v1/sandboxes"] == 1 and e.value.status == 503 and e.value.detail == "draining"


@pytest.fixture(scope="module")
def daemon(home, fake_base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("sdkclient"))
    yield d
    stop_api_daemon(d)


def test_sandbox_streams_lists_connects_and_raises_typed_errors(daemon):
    sock = str(daemon.home / "forkd.sock")
    seen: list[str] = []
    with Sandbox.create(template=BASE_TAG, envs={"WHO": "sdk"}, socket=sock) as sb:
        with pytest.raises(CommandExitException) as e:  # E2B's: a non-zero exit raises, with the output
            sb.commands.run("echo $WHO; echo err >&2; exit 3", on_stdout=seen.append)
        assert (e.value.stdout, e.value.stderr, e.value.exit_code, "".join(seen)) == ("sdk\n", "err\n", 3, "sdk\n")
        assert sb.commands.run("echo $WHO", envs={"WHO": "call"}).stdout == "call\n"
        h = sb.commands.run("sleep 600", background=True)
        assert h.pid and h.kill() and h.wait(120, check=False).exit_code != 0
        sb.files.write("/root/c.txt", b"\x00\xffbytes")
        assert sb.files.read("/root/c.txt", format="bytes") == b"\x00\xffbytes"
        assert sb.eval("WARM_GLOBAL").result == repr(WARM_GLOBAL)
        assert sb.id in [i.id for i in Sandbox.list(socket=sock)]
        assert sb.id not in [i.id for i in Sandbox.list({"owner": "nobody"}, socket=sock)]
        with Sandbox.connect(sb.id, url=daemon.url, token=daemon.token) as again:  # over TCP this time
            assert again.commands.run(["cat", "/root/c.txt"]).stdout_bytes == b"\x00\xffbytes"
        assert sb.ping().pong  # leaving connect's `with` did not kill it
        sid = sb.id
    with pytest.raises(NotFound) as e:
        Client(socket=sock).get_sandbox(sid)
    assert e.value.status == 404


def test_async_sandbox(daemon):
    async def go():
        async with await AsyncSandbox.create(template=BASE_TAG, envs={"A": "1"}, url=daemon.url,
                                             token=daemon.token) as sb:
            seen: list[str] = []
            with pytest.raises(CommandExitException) as e:
                await sb.commands.run("echo $A; exit 4", on_stdout=seen.append)
            assert (e.value.stdout, e.value.exit_code, seen) == ("1\n", 4, ["1\n"])
            res = await sb.commands.run("echo $A; exit 4", check=False)
            assert (res.stdout, res.exit_code) == ("1\n", 4)
            h = await sb.commands.run(["cat"], background=True, stdin=True)
            await h.send_stdin("piped", eof=True)
            assert (await h.wait(120)).stdout_bytes == b"piped"
            assert (await sb.eval("2 * 21")).result == "42"
            assert sb.id in [i.id for i in await AsyncSandbox.list(controller=sb.controller)]
            return sb.id
    sid = asyncio.run(go())
    with pytest.raises(NotFound):
        Client(url=daemon.url, token=daemon.token).get_sandbox(sid)


def test_upstream_client_code_runs_unchanged(daemon, monkeypatch):
    """Upstream's README flow: Controller(base_url=...) with dicts, Sandbox(tag=...) whose eval returns the value."""
    monkeypatch.setenv("FORKD_TOKEN", daemon.token)
    c = compat.Controller(base_url=daemon.url)
    assert BASE_TAG in [s["tag"] for s in c.list_snapshots()]
    children = c.spawn_sandboxes(BASE_TAG, n=1)
    assert isinstance(children[0], dict)
    sb_id = children[0]["id"]
    try:
        assert c.exec_command(sb_id, ["echo", "up"])["stdout"] == "up\n"
        assert c.eval_code(sb_id, "1 + 1")["result"] == "2"
        assert c.ping_sandbox(sb_id)["pong"]
    finally:
        c.kill_sandbox(sb_id)
    with pytest.raises(compat.ControllerError) as e:
        c.get_sandbox(sb_id)
    assert e.value.status == 404
    monkeypatch.setenv("FORKD_URL", daemon.url)
    with compat.Sandbox(tag=BASE_TAG) as sb:
        assert sb.eval("1 + 1") == "2"
        assert sb.commands.run("echo hi").stdout == "hi\n"
        with pytest.raises(RuntimeError):
            sb.eval("1 / 0")


# fields the client reads before every daemon serves them (labels: from the lifetimes/labels work on the API)
AHEAD: dict[str, set[str]] = {}  # fields the client knows before the daemon has them (none today)


def test_the_client_models_match_the_daemons_openapi():
    """Every field forkd_client's answer models declare is in the daemon's schema of the same name, so the
    Python client cannot drift from the API (the TypeScript types are generated from the same document)."""
    import importlib.util

    from forkd_client import models

    from tests.test_sdk import REPO

    path = REPO / "sdk" / "typescript" / "scripts" / "openapi_types.py"
    spec = importlib.util.spec_from_file_location("openapi_types", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    schemas = gen.spec_in_process()["components"]["schemas"]
    checked = 0
    answered_as = {"SnapshotInfo": "SnapshotView"}  # the snapshot routes answer the typed view, a superset
    for name in ("SnapshotInfo", "SnapshotDetail", "SandboxInfo", "ExecResult", "EvalResult", "PingResult",
                 "FileWritten"):
        have = set(schemas[answered_as.get(name, name)]["properties"])
        missing = set(getattr(models, name).model_fields) - have - AHEAD.get(name, set())
        assert not missing, f"{name}: forkd_client declares {sorted(missing)}, the daemon's schema has not"
        checked += 1
    assert checked == 7


def test_a_stream_to_an_unreachable_daemon_is_unavailable_after_retries(tmp_path):
    """Streamed commands (sync and async) get the same retries and the same error as plain requests."""
    from forkd_client import AsyncClient, SandboxInfo

    info = SandboxInfo(id="c-none", snapshot_tag="t", status="running")
    sock = tmp_path / "no.sock"  # nothing listens there
    sb = Sandbox(info, Client(socket=sock, retry=Retry(attempts=2, first_wait=0.01)), owned=False)
    with pytest.raises(Unavailable, match=r"2 attempt\(s\)"):
        sb.commands.run("true")

    async def go():
        asb = AsyncSandbox(info, AsyncClient(socket=sock, retry=Retry(attempts=2, first_wait=0.01)), owned=False)
        await asb.commands.run("true")
    with pytest.raises(Unavailable, match=r"2 attempt\(s\)"):
        asyncio.run(go())
