"""What only a VM shows through a real daemon (the rest of the SDK, process, fork-verb and files tests run on the
fake VMM driver): a live branch the daemon takes while it holds the child's agent is captured by pages, and by
write-protect once the child wrote more than 1/40 of its RAM; `forkd logs` prints what the guest wrote to its
console; `sb.fork(n)` makes n children that continue from the instant of the fork, over a diff layer of the pages
the source wrote."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from forkd.core import lifetimes
from forkd.sdk import Controller, ControllerError, Sandbox
from tests.conftest import BASE_TAG
from tests.test_api import start_api_daemon, stop_api_daemon

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("daemonvm"))
    yield d
    stop_api_daemon(d)


def _tags(ctrl) -> set[str]:
    return {s.tag for s in ctrl.list_snapshots()}


def test_a_live_branch_through_the_daemon_is_by_pages_until_the_child_wrote_too_much(daemon):
    ctrl = Controller(base_url=daemon.url, token=daemon.token)
    with Sandbox.create(template=BASE_TAG, controller=ctrl) as sb:
        try:
            br = ctrl.branch_sandbox(sb.id, "dvm-branch", mode="live", wait=True)
            assert br.status == "ready" and br.mode == "live"
            assert br.capture == "pages" and br.capture_note is None  # the daemon holds the child's agent: by pages
            assert ctrl.exec_command(sb.id, ["python3", "-c", "bytearray(64 << 20)"]).exit_code == 0  # 1/8 of RAM
            wp = ctrl.branch_sandbox(sb.id, "dvm-branch-wp", mode="live", wait=True)
            assert wp.status == "ready" and wp.capture == "write-protect" and "1/40" in wp.capture_note, wp
        finally:
            for tag in ("dvm-branch", "dvm-branch-wp"):
                try:
                    ctrl.delete_snapshot(tag)
                except ControllerError:
                    pass


def test_cli_logs_prints_the_console(daemon, tmp_path):
    ctrl = Controller(url=daemon.url, token=daemon.token)
    with Sandbox.create(template=BASE_TAG, controller=ctrl) as sb:
        sb.commands.run("echo forkd-console-marker > /dev/console")
        env = dict(os.environ, FORKD_HOME=str(tmp_path), FORKD_URL=daemon.url, FORKD_TOKEN=daemon.token)

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, env=env,
                                  timeout=300)

        res = cli("logs", sb.id)
        assert res.returncode == 0 and b"forkd-console-marker" in res.stdout, res.stderr
        assert cli("logs", "cnosuchchild").returncode == 3


def test_fork_n_continues_from_this_instant_and_cleans_up(daemon):
    ctrl = Controller(socket=daemon.sock)
    with Sandbox.create(template=BASE_TAG, controller=ctrl) as src:
        src.run_code("STATE = 'before-fork'")
        src.commands.run("echo at-fork > /root/marker")
        kids = src.fork(2)
        assert len(kids) == 2 and len({k.id for k in kids} | {src.id}) == 3
        tag = kids[0].info.snapshot_tag
        assert {k.info.snapshot_tag for k in kids} == {tag}
        snap = ctrl.get_snapshot(tag)
        assert snap.labels.get(lifetimes.AUTO) == "fork"
        # a diff branch: a layer over the source's snapshot holding the pages the source wrote
        assert snap.labels.get("forkd.dev/branch-mode") == "diff" and snap.parent_tag == BASE_TAG
        assert 0 < snap.diff_pages < snap.memory_mib * 256 // 10
        src.run_code("STATE = 'after-fork'")  # the source goes on; the children keep the instant of the fork
        for k in kids:
            assert k.eval("STATE").result == repr("before-fork")
            assert k.commands.run("cat /root/marker").stdout.strip() == "at-fork"
            assert k.info.labels.get("forkd.dev/fork-of") == src.id
        assert src.eval("STATE").result == repr("after-fork")
        kids[0].kill()
        assert tag in _tags(ctrl)  # one of its children still runs on it
        kids[1].kill()
        assert tag not in _tags(ctrl)  # gone with the last of them
