"""Issue 16, deliverable 4 against a real daemon with real VMs: `sb.fork(n)` / `POST /v1/sandboxes/{id}/fork`
returns n running sandboxes that continue from this instant (the source keeps running); the branch snapshot goes
with the last of them unless kept; `forkd fork --from-sandbox ID -n N` through the daemon does the same."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forkd.core import lifetimes
from forkd.sdk import Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.test_api import start_api_daemon, stop_api_daemon


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("forkverb"))
    yield d
    stop_api_daemon(d)


def _tags(ctrl) -> set[str]:
    return {s.tag for s in ctrl.list_snapshots()}


@pytest.mark.vm
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


@pytest.mark.vm
def test_fork_keep_and_upstream_shape(daemon):
    ctrl = Controller(socket=daemon.sock)
    with Sandbox.create(template=BASE_TAG, controller=ctrl) as src, daemon.unix() as c:
        r = c.post(f"/v1/sandboxes/{src.id}/fork", json={"n": 1, "keep": True})
        assert r.status_code == 201, r.text
        (kid,) = r.json()
        assert kid["status"] == "running" and kid["expires_at_unix"]
        c.delete(f"/v1/sandboxes/{kid['id']}")
        assert kid["snapshot_tag"] in _tags(ctrl)  # kept
        ctrl.delete_snapshot(kid["snapshot_tag"])
        bad = c.post(f"/v1/sandboxes/{src.id}/fork", json={"n": 1, "count": 2})
        assert bad.status_code == 422 and "count" in bad.json()["detail"]


@pytest.mark.vm
def test_cli_fork_from_sandbox(daemon):
    ctrl = Controller(socket=daemon.sock)
    with Sandbox.create(template=BASE_TAG, controller=ctrl, metadata={"who": "cli-test"}) as src:
        run = subprocess.run([sys.executable, "-m", "forkd.cli.main", "fork", "--from-sandbox", src.id, "-n", "2",
                              "-o", "json"], env=daemon.env(), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        kids = json.loads(run.stdout)["children"]
        assert len(kids) == 2 and all(k["status"] == "running" for k in kids)
        ls = subprocess.run([sys.executable, "-m", "forkd.cli.main", "ls", "-l", "who=cli-test", "-o", "json"],
                            env=daemon.env(), capture_output=True, text=True, timeout=120)
        assert ls.returncode == 0, ls.stderr
        assert [x["id"] for x in json.loads(ls.stdout)] == [src.id]
        tag = kids[0]["snapshot"]
        kill = subprocess.run([sys.executable, "-m", "forkd.cli.main", "kill", *(k["id"] for k in kids)],
                              env=daemon.env(), capture_output=True, text=True, timeout=120)
        assert kill.returncode == 0, kill.stderr
        assert tag not in _tags(ctrl)
        none = subprocess.run([sys.executable, "-m", "forkd.cli.main", "fork"], env=daemon.env(),
                              capture_output=True, text=True, timeout=60)
        assert none.returncode == 2
