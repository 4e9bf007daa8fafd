"""`sb.fork(n)` / `POST /v1/sandboxes/{id}/fork` against a real daemon on the fake VMM driver (tests/fake_vmm.py; the
route, the SDK and the CLI are logic above it): n running sandboxes, the branch snapshot kept on request, unknown
fields refused; `forkd fork --from-sandbox ID -n N` through the daemon does the same and its snapshot goes with the
last child. That the children continue from the instant of the fork, as a diff layer: tests/test_daemon_vm.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forkd.sdk import Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("forkverb"))
    yield d
    stop_api_daemon(d)


def _tags(ctrl) -> set[str]:
    return {s.tag for s in ctrl.list_snapshots()}


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
