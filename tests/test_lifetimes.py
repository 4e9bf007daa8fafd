"""Lifetimes against a real daemon on the fake VMM driver (tests/fake_vmm.py): every sandbox has a timeout the
daemon enforces even when its caller is gone (expiry in the audit log), set_timeout extends it, labels are shown and
filterable, and branch snapshots forkd named itself are removed by policy, never while a child runs on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from forkd.base.errors import InvalidInput
from forkd.core import lifetimes
from forkd.sdk import Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_home  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.scrape import scraped
from tests.test_api import start_api_daemon, stop_api_daemon

BRANCH_TTL = 5.0  # seconds: more than a fork from the new branch takes on the fake driver, even on a loaded host
SETTINGS = {"FORKD_SWEEP_INTERVAL": "0.5", "FORKD_SANDBOX_TIMEOUT": "900", "FORKD_BRANCH_TTL": str(BRANCH_TTL)}


@pytest.fixture(scope="module")
def daemon(home, fake_base, tmp_path_factory):
    old = {k: os.environ.get(k) for k in SETTINGS}
    os.environ.update(SETTINGS)
    try:
        d = start_api_daemon(home, tmp_path_factory.mktemp("life"))
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    yield d
    stop_api_daemon(d)


def _until(pred, what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, f"not within {limit:.0f} s: {what}"
        time.sleep(0.25)


def _sweeps(daemon) -> float:
    """Passes of the daemon's idle loop so far (forkd_sweeps_total)."""
    with daemon.unix() as c:
        return scraped(c, "forkd_sweeps_total")


def _audit(home) -> list[dict]:
    return [json.loads(x) for x in (home / "audit.log").read_text().splitlines() if x.strip()]


def test_selectors():
    sel = lifetimes.parse_selector(["team=a", "gpu", "team"])
    assert sel == [("team", "a"), ("gpu", None), ("team", None)]
    assert lifetimes.matches({"team": "a", "gpu": "1"}, sel)
    assert not lifetimes.matches({"team": "b", "gpu": "1"}, sel)
    assert not lifetimes.matches({"team": "a"}, sel)
    with pytest.raises(InvalidInput):
        lifetimes.parse_selector(["=x"])


def test_sandbox_expires_though_its_caller_is_gone(daemon):
    """Before: a sandbox made by POST /v1/sandboxes lived forever. Its caller here closes its connection at once."""
    with daemon.unix() as c:
        r = c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "lifetime_secs": 2})
        assert r.status_code == 201, r.text
        info = r.json()[0]
    assert info["expires_at_unix"] and info["expires_at_unix"] >= info["created_at_unix"]
    sid = info["id"]
    with daemon.unix() as c:
        _until(lambda: c.get(f"/v1/sandboxes/{sid}").status_code == 404, "the expired sandbox killed")
    _until(lambda: any(e.get("actor") == "sweeper" and e.get("action") == "expire" and e.get("target") == sid
                       for e in _audit(daemon.home)), "the expiry in the audit log", 10)


def test_default_timeout_and_set_timeout(daemon):
    ctrl = Controller(socket=daemon.sock)
    sb = Sandbox.create(template=BASE_TAG, controller=ctrl)
    try:
        first = sb.info.expires_at_unix
        assert first is not None and first - sb.info.created_at_unix >= 800  # FORKD_SANDBOX_TIMEOUT=900
        sb.set_timeout(3)
        short = sb.info.expires_at_unix
        assert short < first
        sb.set_timeout(600)  # keepalive: pushed out again before the short one ran out
        time.sleep(max(0.0, short + 0.5 - time.time()))  # past the 3 s it had before the keepalive
        passes = _sweeps(daemon)
        _until(lambda: _sweeps(daemon) >= passes + 2, "two sweeps begun after the short timeout")
        assert sb.get_info().status == "running"
        before = sb.info.expires_at_unix
        run = subprocess.run([sys.executable, "-m", "forkd.cli.main", "set-timeout", sb.id, "1200", "-o", "json"],
                             env=daemon.env(), capture_output=True, text=True, timeout=120)  # keepalive (CLI)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["expires_at"] > before
        assert sb.ping().pong
    finally:
        sb.kill()


def test_labels_are_shown_and_filterable(daemon):
    ctrl = Controller(socket=daemon.sock)
    a = Sandbox.create(template=BASE_TAG, controller=ctrl, metadata={"team": "search", "run": "1"})
    b = Sandbox.create(template=BASE_TAG, controller=ctrl, metadata={"team": "ads"})
    try:
        assert a.get_info().labels == {"team": "search", "run": "1"}
        assert [s.id for s in Sandbox.list(metadata={"team": "search"}, controller=ctrl)] == [a.id]
        with daemon.unix() as c:
            ids = {s["id"] for s in c.get("/v1/sandboxes", params=[("label", "team")]).json()}
            assert {a.id, b.id} <= ids
            only = c.get("/v1/sandboxes", params=[("label", "team=ads"), ("label", "team")]).json()
            assert [s["id"] for s in only] == [b.id]
            bad = c.post("/v1/sandboxes", json={"snapshot_tag": BASE_TAG, "labels": {"bad key!": "x"}})
            assert bad.status_code == 422
    finally:
        a.kill()
        b.kill()


def test_auto_named_branches_are_collected_but_never_while_used(daemon):
    """Before: branch snapshots made without a tag were never cleaned up."""
    ctrl = Controller(socket=daemon.sock)
    src = Sandbox.create(template=BASE_TAG, controller=ctrl)
    try:
        res = src.branch()  # no tag: forkd names it and labels it forkd.dev/auto=branch
        tag = res.tag
        assert res.labels.get(lifetimes.AUTO) == "branch"
        user = Sandbox.create(template=tag, controller=ctrl)  # within the TTL: a child runs on it from now on
        named = src.branch(tag=f"kept-{src.id}")
        time.sleep(max(0.0, res.created_at_unix + BRANCH_TTL + 1 - time.time()))  # the TTL passing
        passes = _sweeps(daemon)
        _until(lambda: _sweeps(daemon) >= passes + 2, "two sweeps begun after the TTL")  # kept while `user` runs
        tags = {s.tag for s in ctrl.list_snapshots()}
        assert tag in tags and named.tag in tags
        user.kill()
        _until(lambda: tag not in {s.tag for s in ctrl.list_snapshots()}, "the unused auto branch removed", 30)
        assert named.tag in {s.tag for s in ctrl.list_snapshots()}  # a tag given by the user is never collected
        ctrl.delete_snapshot(named.tag)
    finally:
        src.kill()


POOL = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: life-base}
spec: {memoryMiB: 256, vcpus: 1}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: life-pool}
spec: {from: life-base, warm: 1, child: {network: none}}
"""


def _cli(daemon, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], input=stdin, env=daemon.env(),
                          capture_output=True, text=True, timeout=600)


def test_children_claimed_from_a_pool_without_a_ttl_have_a_timeout_too(daemon, tmp_path):
    """Before: a child claimed from a pool with no child.ttlSeconds (`forkd claim`, POST /v1/pools/{name}/claim,
    `Sandbox.create(pool=...)`) never expired: an agent that crashed after claiming leaked it. Now it gets the call's
    lifetime, else the daemon's FORKD_SANDBOX_TIMEOUT, and the reconciler retires it when that ends. The CLI gives
    its own with `forkd claim --lifetime`, and finds the daemon by FORKD_DAEMON_SOCKET as the SDK does."""
    run = _cli(daemon, "apply", "-f", "-", "--wait", "--timeout", "10m", stdin=POOL)
    assert run.returncode == 0, run.stderr
    ctrl = Controller(socket=daemon.sock)
    sb = Sandbox.create(pool="life-pool", controller=ctrl)
    try:
        assert sb.info.expires_at_unix is not None
        assert sb.info.expires_at_unix - time.time() >= 800  # FORKD_SANDBOX_TIMEOUT=900
        run = _cli(daemon, "claim", "life-pool", "-o", "json")  # the CLI's claim: the same default
        assert run.returncode == 0, run.stderr
        (cli_claimed,) = json.loads(run.stdout)["children"]
        assert cli_claimed["expires_at"] - time.time() >= 800
        assert ctrl.get_sandbox(cli_claimed["id"]).expires_at_unix - time.time() >= 800
        # the CLI's own lifetime, reaching the daemon by FORKD_DAEMON_SOCKET from a home that has no daemon
        env = {**daemon.env(), "FORKD_HOME": str(tmp_path / "elsewhere"), "FORKD_DAEMON_SOCKET": str(daemon.sock)}
        run = subprocess.run([sys.executable, "-m", "forkd.cli.main", "claim", "life-pool", "--lifetime", "2m",
                              "-o", "json"], env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        (timed,) = json.loads(run.stdout)["children"]
        assert 100 <= ctrl.get_sandbox(timed["id"]).expires_at_unix - time.time() <= 121
        run = subprocess.run([sys.executable, "-m", "forkd.cli.main", "exec", timed["id"], "--", "echo", "via-env"],
                             env=env, capture_output=True, text=True, timeout=600)  # the CLI's fast exec path too
        assert (run.returncode, run.stdout.strip()) == (0, "via-env"), run.stderr
        ctrl.kill_sandbox(timed["id"])
        bad = _cli(daemon, "claim", "life-pool", "--lifetime", "0")
        said = " ".join(bad.stderr.replace("│", " ").split())  # the usage box wraps lines
        assert bad.returncode == 2 and "a lifetime is more than 0 and at most 30 days" in said, bad.stderr
        short = Sandbox.create(pool="life-pool", controller=ctrl, timeout=2)  # the call's own lifetime
        assert short.info.expires_at_unix - time.time() <= 3
        with daemon.unix() as c:
            _until(lambda: c.get(f"/v1/sandboxes/{short.id}").status_code == 404,
                   "the claimed child retired when its lifetime ended")
        assert sb.get_info().status == "running"
    finally:
        sb.kill()
        _cli(daemon, "kill", cli_claimed["id"]) if "cli_claimed" in locals() else None
        assert _cli(daemon, "delete", "-f", "-", stdin=POOL).returncode == 0
