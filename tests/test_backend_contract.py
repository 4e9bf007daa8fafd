"""One front door, two implementations: LocalBackend (in-process) and RemoteBackend (a real daemon process, over
TCP with its token, on the same home) answer each verb with the same wire model and fail with the same error kind.
Both go through the one service (forkd.service), so a child made either way has the same lifetime and a fork's
snapshot goes with its last child either way. The home runs the fake VMM driver (tests/fake_vmm.py): what is
compared here is the logic above the driver."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.base.errors import Conflict, ForkdError, NotFound
from forkd.base.paths import Layout
from forkd.client.local import LocalBackend
from forkd.client.remote import RemoteBackend
from forkd.core.requests import Branch, Compaction, ParentBuild, Spawn
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.service import wire
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_home  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon

MISSING = "c-no-such-child"


@pytest.fixture(scope="module")
def doors(home, tmp_path_factory):
    """The daemon's sweeper waits an hour between passes here: what these tests see removed, the verb removed."""
    old = os.environ.get("FORKD_SWEEP_INTERVAL")
    os.environ["FORKD_SWEEP_INTERVAL"] = "3600"
    try:
        d = start_api_daemon(home, tmp_path_factory.mktemp("contract"))
    finally:
        os.environ.pop("FORKD_SWEEP_INTERVAL") if old is None else os.environ.__setitem__("FORKD_SWEEP_INTERVAL", old)
    yield {"local": LocalBackend(Control(Runtime(Layout(home)))), "remote": RemoteBackend(url=d.url, token=d.token)}
    stop_api_daemon(d)


def _kind(call) -> str:
    """The error kind a call fails with (its class name), or 'ok'."""
    try:
        call()
    except ForkdError as exc:
        return type(exc).__name__
    return "ok"


VERBS_ON_NOTHING = {
    "snapshot_info": lambda b: b.snapshot_info("no-such-snapshot"),
    "rmi": lambda b: b.rmi("no-such-snapshot"),
    "set_timeout": lambda b: b.set_timeout(MISSING, 10),
    "child": lambda b: b.child(MISSING),
    "eval": lambda b: b.eval(MISSING, "1"),
    "exec": lambda b: b.exec(MISSING, ["true"]),
    "ping": lambda b: b.ping(MISSING),
    "branch": lambda b: b.branch(Branch.of(child_id=MISSING, tag="contract-none")),
    "fork_from": lambda b: b.fork_from(MISSING, 1),
    "fork": lambda b: b.fork(Spawn.of(tag="no-such-snapshot", n=1)),
    "compact": lambda b: b.compact(Compaction.of(from_tag="no-such-snapshot", to_tag="contract-never")),  # a job
}


@pytest.mark.parametrize("verb", sorted(VERBS_ON_NOTHING))
def test_a_verb_on_nothing_fails_alike(doors, verb):
    call = VERBS_ON_NOTHING[verb]
    kinds = {name: _kind(lambda b=b: call(b)) for name, b in doors.items()}
    assert kinds["local"] == kinds["remote"] != "ok", kinds


def test_listings_agree(doors):
    snaps = {name: sorted(s.get("tag", "?") for s in b.snapshots()) for name, b in doors.items()}
    assert snaps["local"] == snaps["remote"]
    kids = {name: sorted(c["id"] for c in b.children()) for name, b in doors.items()}
    assert kids["local"] == kids["remote"]


def test_a_child_answers_alike_through_both_doors(doors, fake_base):
    """fork, exec, eval, ping and branch: the same model, the same fields, the same values; each child has the
    service's lifetime whichever door made it (in-process `forkd fork` used to give none)."""
    seen = {}
    for name, b in doors.items():
        (kid,) = b.fork(Spawn.of(tag=BASE_TAG, n=1))
        try:
            seen[name] = _answers(b, kid["id"], f"contract-{name}")
            assert kid["expires_at"] is not None, f"{name}: a hand-made child without a lifetime"
        finally:
            b.kill([kid["id"]])
            b.rmi(f"contract-{name}", force=True)
    assert seen["local"] == seen["remote"]


def _answers(b, cid: str, tag: str) -> dict:
    ev, bad = b.eval(cid, "6 * 7"), b.eval(cid, "1 / 0")
    ex, pong = b.exec(cid, ["sh", "-c", "echo out; echo err >&2; exit 3"]), b.ping(cid)
    br = b.branch(Branch.of(child_id=cid, tag=tag, mode="live"))
    assert type(ev) is type(bad) is wire.EvalAnswer and type(br) is wire.BranchAnswer
    assert isinstance(ex, wire.ExecResult) and isinstance(pong, wire.PingResult)
    assert br.source == cid and br.snapshot.tag == tag and br.snapshot.branched_from == cid
    return {"eval": ev.model_dump(), "error": bad.error["type"], "exec": (ex.stdout, ex.stderr, ex.exit_code),
            "branch": (sorted(br.model_dump()), sorted(br.snapshot.model_dump()), br.snapshot.status, br.mode)}


def test_a_fork_snapshot_goes_with_its_last_child_through_both_doors(doors, fake_base):
    """fork --from-sandbox without a tag names its snapshot; killing its last child removes it, in-process too."""
    for name, b in doors.items():
        (src,) = b.fork(Spawn.of(tag=BASE_TAG, n=1))
        try:
            (kid,) = b.fork_from(src["id"], 1)
            assert kid["expires_at"] is not None, name
            b.kill([kid["id"]])
            assert kid["snapshot"] not in {s.get("tag") for s in b.snapshots()}, f"{name}: fork snapshot left"
        finally:
            b.kill([src["id"]])


def test_the_child_listing_is_one_typed_view_through_both_doors(doors, fake_base):
    """children() answers forkd.service.listing.ChildView in-process and through the daemon, field for field (the
    daemon is reached over TCP, so its view carries no agent socket); upstream's `/v1/sandboxes` lists the same
    child as the view made into upstream's SandboxInfo."""
    from forkd.service.listing import ChildView

    local, remote = doors["local"], doors["remote"]
    (kid,) = local.fork(Spawn.of(tag=BASE_TAG, n=1))
    try:
        here = {c.id: c for c in local.children()}[kid.id]
        there = {c.id: c for c in remote.children()}[kid.id]
        assert type(here) is type(there) is type(kid) is ChildView
        assert here.elsewhere() == there
        assert local.child(kid.id) == here and remote.child(kid.id) == there  # get: the listing's view
        compat = {s["id"]: s for s in remote._call("GET", "/v1/sandboxes")}[kid.id]
        assert compat == wire.sandbox_info(there).model_dump(mode="json")
        assert remote._call("GET", f"/v1/children/{kid.id}") == here.to_json()  # the daemon's own host view
        longer = {name: b.set_timeout(kid.id, 600) for name, b in doors.items()}
        assert all(type(v) is ChildView and v.id == kid.id for v in longer.values())
    finally:
        local.kill([kid.id])


def test_the_snapshot_listing_is_one_typed_view_through_both_doors(doors, fake_base):
    """snapshots() answers forkd.service.listing.SnapshotView in-process and through the daemon, field for field;
    a build answers the view too; upstream's `/v1/snapshots/{tag}` and SnapshotInfo read the same snapshot."""
    from forkd.service.listing import SnapshotView

    local, remote = doors["local"], doors["remote"]
    here = {s.tag: s for s in local.snapshots()}
    there = {s.tag: s for s in remote.snapshots()}
    assert all(type(s) is SnapshotView for s in [*here.values(), *there.values()])
    assert here == there and here[BASE_TAG].status == "ready"
    assert remote._call("GET", f"/v1/snapshots/{BASE_TAG}") == here[BASE_TAG].to_json()
    upstream = wire.SnapshotInfo.model_validate(remote._call("GET", f"/v1/snapshots/{BASE_TAG}"))
    keys = set(wire.SnapshotInfo.model_fields)
    assert upstream.model_dump(include=keys) == local.service.info(fake_base).model_dump(include=keys)
    assert local.snapshot_info(BASE_TAG) == remote.snapshot_info(BASE_TAG)
    built = {}
    for name, b in doors.items():
        view = b.compact(Compaction.of(from_tag=BASE_TAG, to_tag=f"contract-flat-{name}"))
        try:
            assert type(view) is SnapshotView and view == {s.tag: s for s in b.snapshots()}[view.tag], name
            built[name] = {k: v for k, v in view.to_json().items() if k not in ("tag", "dir", "created_at",
                                                                                  "created_at_unix", "timings_ms")}
        finally:
            assert b.rmi(view.tag) == [view.tag]
    assert built["local"] == built["remote"]


def test_the_python_sdk_waits_on_build_jobs(doors, fake_base):
    """Client and AsyncClient build through a job and wait on it (each new phase reported); a failed build raises
    the kind a blocking call raised; the job stays listed with its result."""
    from forkd_client import AsyncClient, Client, NotFound

    ep = doors["remote"].endpoint
    phases: list[str] = []
    with Client(url=ep.base_url, token=ep.token) as c:
        info = c.compact_snapshot(BASE_TAG, "contract-sdk")
        job = c.submit_compaction(BASE_TAG, "contract-sdk-2")
        done = c.wait_job(job.id, timeout=120, on_phase=phases.append)
        try:
            assert info.tag == "contract-sdk" and info.status == "ready"
            assert done.state == "succeeded" and done.result["tag"] == "contract-sdk-2"
            assert done.phase is None or phases[-1] == done.phase
            assert {job.id} <= {j.id for j in c.list_jobs()}
            with pytest.raises(NotFound):
                c.compact_snapshot("no-such-snapshot", "contract-never")
        finally:
            c.delete_snapshot("contract-sdk")
            c.delete_snapshot("contract-sdk-2")

    async def run() -> str:
        async with AsyncClient(url=ep.base_url, token=ep.token) as a:
            got = await a.compact_snapshot(BASE_TAG, "contract-sdk-async")
            await a.delete_snapshot(got.tag)
            return got.tag

    assert asyncio.run(run()) == "contract-sdk-async"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_typescript_sdk_waits_on_build_jobs(doors, fake_base):
    ep = doors["remote"].endpoint
    env = dict(os.environ, FORKD_URL=ep.base_url, FORKD_TOKEN=ep.token, FORKD_TEST_SNAPSHOT=BASE_TAG)
    res = subprocess.run(["node", "--test", "test/jobs.test.js"], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent / "sdk" / "typescript", timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "# fail 0" in res.stdout and "# skipped 0" in res.stdout and "# pass 1" in res.stdout


def test_the_cli_builds_through_the_daemons_job(doors, fake_base):
    """`forkd snapshot compact` through a daemon (FORKD_URL) submits the job, reports it (the table output's
    progress lines), waits and prints the snapshot; a build that fails exits with the code of its error kind and
    says why."""
    import sys

    ep = doors["remote"].endpoint
    env = dict(os.environ, FORKD_URL=ep.base_url, FORKD_TOKEN=ep.token)
    cli = [sys.executable, "-m", "forkd.cli.main", "snapshot", "compact"]
    ok = subprocess.run([*cli, "--from", BASE_TAG, "--to", "contract-cli"], env=env, capture_output=True,
                        text=True, timeout=300)
    try:
        assert ok.returncode == 0, ok.stderr
        assert "contract-cli" in ok.stdout and doors["remote"].snapshot_info("contract-cli")["status"] == "ready"
        job = next(j for j in doors["remote"].api.list_jobs() if j.target == "contract-cli")
        assert job.state == "succeeded" and job.id in ok.stdout + ok.stderr, (ok.stdout, ok.stderr)
    finally:
        doors["remote"].rmi("contract-cli")
    bad = subprocess.run([*cli, "--from", "no-such-snapshot", "--to", "contract-cli-never"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == NotFound.exit_code and "no-such-snapshot" in bad.stderr, bad.stderr


BLOCKED = "exec sleep 600"  # a warm-up command that would hold its build for ten minutes


def _blocked_build(remote: RemoteBackend, tag: str) -> dict:
    """A parent build on the daemon, once it is blocked in its warm-up command: its job."""
    job = remote._call("POST", "/v1/snapshots/build/parent",
                       json={"tag": tag, "memory_mib": 128, "warm_run": [BLOCKED]})
    while not (job.get("phase") or "").startswith(f"warming up: {BLOCKED}"):
        assert job["state"] == "running", job
        job = remote.job(job["id"], wait_secs=30, since=job["version"])
    return job


def test_the_cli_cancels_a_running_build_on_the_daemon(doors, fake_base):
    """`forkd job cancel ID` waits until the build has stopped and prints it cancelled; `forkd job ls` lists it
    so; cancelling it again exits with Conflict's code, naming its state; its snapshot is not left."""
    remote = doors["remote"]
    job = _blocked_build(remote, "contract-cancel")
    env = dict(os.environ, FORKD_URL=remote.endpoint.base_url, FORKD_TOKEN=remote.endpoint.token)
    cli = [sys.executable, "-m", "forkd.cli.main", "job"]
    ok = subprocess.run([*cli, "cancel", job["id"], "-o", "json"], env=env, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["state"] == "cancelled", ok.stdout
    listed = subprocess.run([*cli, "ls", "-o", "yaml"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and f"id: {job['id']}" in listed.stdout, listed.stderr
    again = subprocess.run([*cli, "cancel", job["id"]], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == Conflict.exit_code and "is cancelled" in again.stderr, again.stderr
    assert "contract-cancel" not in {v.tag for v in remote.snapshots()}


def test_ctrl_c_while_waiting_on_a_build_cancels_it(doors, fake_base):
    """An interrupt while RemoteBackend waits on a build's job (the CLI's Ctrl-C) cancels the job on the daemon."""
    remote = doors["remote"]

    def interrupt_in_warm_up(line: str) -> None:
        if line.startswith(f"warming up: {BLOCKED}"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        remote.create_snapshot(ParentBuild.of(tag="contract-interrupted", memory_mib=128, warm_run=(BLOCKED,)),
                               progress=interrupt_in_warm_up)
    job = next(j for j in remote.jobs() if j["target"] == "contract-interrupted")
    assert remote.job(job["id"], wait_secs=30)["state"] == "cancelled"
    assert "contract-interrupted" not in {v.tag for v in remote.snapshots()}
