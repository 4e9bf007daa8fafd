"""The Python SDK (sync and async) and the TypeScript SDK (node --test) against a real daemon on the fake VMM driver
(tests/fake_vmm.py; the SDKs and the daemon are logic above it): spawn -> exec -> eval -> branch -> spawn from the
branch -> kill; also the CLI through FORKD_URL/FORKD_TOKEN. How a VM's live branch is captured through the daemon:
tests/test_daemon_vm.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.sdk import AsyncController, AsyncSandbox, Controller, ControllerError, Sandbox
from tests.conftest import BASE_TAG, WARM_GLOBAL, forkd_cli
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("sdk"))
    yield d
    stop_api_daemon(d)


def test_controller_round_trip_with_branch(daemon, rt):
    ctrl = Controller(base_url=daemon.url, token=daemon.token)  # upstream's keyword (a TypeError before)
    assert BASE_TAG in [s.tag for s in ctrl.list_snapshots()]
    [sb] = ctrl.spawn_sandboxes(BASE_TAG, n=1)
    made = [sb.id]
    try:
        assert sb["snapshot_tag"] == BASE_TAG  # dict-style access, as upstream's SDK returns dicts
        res = ctrl.exec_command(sb.id, ["sh", "-c", "echo sdk > /root/sdk.txt; cat /root/sdk.txt"])
        assert (res.stdout, res.exit_code) == ("sdk\n", 0)
        assert ctrl.eval_code(sb.id, "WARM_GLOBAL").result == repr(WARM_GLOBAL)
        assert ctrl.ping_sandbox(sb.id).pong
        br = ctrl.branch_sandbox(sb.id, "sdk-branch", mode="live", wait=True)
        assert br.status == "ready" and br.branched_from == sb.id and br.mode == "live"
        assert br.capture  # which capture a VM takes: tests/test_daemon_vm.py
        [g] = ctrl.spawn_sandboxes("sdk-branch")
        made.append(g.id)
        assert ctrl.exec_command(g.id, ["cat", "/root/sdk.txt"]).stdout == "sdk\n"
        assert ctrl.snapshot_info("sdk-branch").children == [g.id]
        with pytest.raises(ControllerError) as e:  # in use: 409 naming the child
            ctrl.delete_snapshot("sdk-branch")
        assert e.value.status == 409 and g.id in e.value.detail
        ctrl.kill_sandbox(g.id)
        with pytest.raises(ControllerError) as e:
            ctrl.get_sandbox(g.id)
        assert e.value.status == 404
    finally:
        for i in made:
            try:
                ctrl.kill_sandbox(i)
            except ControllerError:
                pass
        try:
            ctrl.delete_snapshot("sdk-branch")
        except ControllerError:
            pass
    assert "sdk-branch" not in [s.tag for s in ctrl.list_snapshots()]


def test_sandbox_over_the_unix_socket(daemon):
    with Sandbox.create(template=BASE_TAG, socket=daemon.sock) as sb:
        assert sb.commands.run("echo $((6*7))").stdout == "42\n"
        sb.files.write("/root/e2b.txt", "hello")
        assert sb.files.read("/root/e2b.txt") == "hello"
        assert sb.files.read("/root/e2b.txt", format="bytes") == b"hello"
        assert sb.eval("1 + 1").result == "2"
        sb.run_code("x = 41")
        assert sb.eval("x + 1").result == "42"
        sid = sb.id
    with pytest.raises(ControllerError):
        Controller(socket=daemon.sock).get_sandbox(sid)
    with pytest.raises(ValueError):
        Sandbox.create(template=BASE_TAG, pool="p", socket=daemon.sock)


def test_async_variants(daemon):
    async def go():
        async with AsyncController(url=daemon.url, token=daemon.token) as ctrl:
            sbs = await ctrl.spawn_sandboxes(BASE_TAG, n=2)
            try:
                outs = await asyncio.gather(*(ctrl.exec_command(s.id, ["echo", s.id]) for s in sbs))
                assert [o.stdout for o in outs] == [f"{s.id}\n" for s in sbs]
            finally:
                await asyncio.gather(*(ctrl.kill_sandbox(s.id) for s in sbs))
            async with await AsyncSandbox.create(template=BASE_TAG, controller=ctrl) as sb:
                assert (await sb.commands.run("echo async")).stdout == "async\n"
                await sb.files.write("/root/a.txt", b"bytes")
                assert await sb.files.read("/root/a.txt") == "bytes"
                assert (await sb.eval("WARM_GLOBAL")).result == repr(WARM_GLOBAL)
                sid = sb.id
            with pytest.raises(ControllerError):
                await ctrl.get_sandbox(sid)
    asyncio.run(go())


def test_cli_goes_through_the_daemon_over_tcp(daemon, tmp_path):
    """FORKD_URL + FORKD_TOKEN: the CLI's declarative commands use the daemon (the audit log shows the call)."""
    pool = tmp_path / "pool.yaml"
    pool.write_text("apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\nmetadata: {name: cli-tcp}\n"
                    "spec: {from: cli-tcp-missing, warm: 0}\n")
    env = daemon.env()
    before = (daemon.home / "audit.log").read_text().count("\n")
    res = subprocess.run([*forkd_cli_argv(), "apply", "-f", str(pool)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = (daemon.home / "audit.log").read_text().splitlines()[before:]
    assert any(json.loads(ln)["action"] == "POST /v1/apply" and json.loads(ln)["via"] == "tcp" for ln in lines)
    bad = dict(env, FORKD_TOKEN="wrong")
    res = subprocess.run([*forkd_cli_argv(), "get", "pools"], env=bad, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "bearer token" in res.stderr
    forkd_cli("delete", "pool/cli-tcp")


def forkd_cli_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "forkd.cli.main"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_typescript_sdk(daemon):
    env = dict(os.environ, FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token, FORKD_TEST_SNAPSHOT=BASE_TAG,
               FORKD_SOCKET=str(daemon.sock))
    # test/ports.test.js needs a TLS daemon with a port grant: tests/test_ports_tls.py runs it
    res = subprocess.run(["node", "--test", "test/sdk.test.js"], cwd=REPO / "sdk" / "typescript", env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "# fail 0" in res.stdout and "# skipped 0" in res.stdout and "# pass 10" in res.stdout


def test_typescript_types_match_the_daemons_openapi():
    """sdk/typescript/src/wire.d.ts is generated from /openapi.json: regenerate it and diff (no daemon needed)."""
    res = subprocess.run([sys.executable, str(REPO / "sdk" / "typescript" / "scripts" / "openapi_types.py"), "--check"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
