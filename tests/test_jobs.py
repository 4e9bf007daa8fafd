"""Builds as jobs (forkd.service.jobs): the job table itself (bounds, cancellation, failures kept as their error
kind, records that outlive their process, a restart never leaving a job running), then the routes on a home
running the fake VMM driver (tests/fake_vmm.py: what is tested is the logic above the driver): 202 and a job, the
blocking `?wait=true`, upstream's blocking compaction, the deprecated build URLs still blocking. No sleeps: a job's
work blocks on events the test sets."""

from __future__ import annotations

import json
import os
import threading

import pytest
from fastapi.testclient import TestClient

from forkd.api.app import create_app
from forkd.base.cancel import Cancelled, CancelToken
from forkd.base.errors import Busy, Conflict, InvalidInput, NotFound
from forkd.base.paths import Layout
from forkd.core.requests import Compaction, ParentBuild
from forkd.service import Service
from forkd.service.jobs import RESTARTED, Jobs, Limits
from tests.conftest import BASE_TAG

LONG = 30.0  # the longest any wait below may take before the test fails (never reached when the code is right)


class Gate:
    """A job's work that reports a phase, then blocks until the test opens it."""

    def __init__(self, answer=None, raises: BaseException | None = None):
        self.started, self.opened, self.answer, self.raises = threading.Event(), threading.Event(), answer, raises

    def __call__(self, progress, cancel=None):
        progress("working")
        self.started.set()
        assert self.opened.wait(LONG), "the test never opened the gate"
        if self.raises is not None:
            raise self.raises
        return self.answer


def _done(jobs: Jobs, job_id: str):
    job = jobs.wait(job_id, LONG)
    assert job.state in ("succeeded", "failed", "cancelled"), job
    return job


def test_a_job_runs_and_keeps_its_result_on_disk(tmp_path):
    jobs = Jobs(tmp_path / "jobs")
    gate = Gate(answer={"tag": "t"})
    job = jobs.submit("snapshot.parent", gate, target="t")
    assert job.state in ("queued", "running") and job.target == "t" and job.id.startswith("job-")
    assert gate.started.wait(LONG)
    seen = jobs.wait(job.id, LONG, since=job.version)  # answers at the next change: running, then the phase
    assert seen.version > job.version and seen.state == "running"
    gate.opened.set()
    done = _done(jobs, job.id)
    assert (done.state, done.result, done.phase, done.error) == ("succeeded", {"tag": "t"}, "working", None)
    assert jobs.outcome(job.id) == {"tag": "t"}
    on_disk = json.loads((tmp_path / "jobs" / f"{job.id}.json").read_text())
    assert on_disk["state"] == "succeeded" and on_disk["result"] == {"tag": "t"}
    assert [j.id for j in Jobs(tmp_path / "jobs").list()] == [job.id]  # another process reads it back


def test_a_failed_job_keeps_the_error_kind_and_a_blocking_caller_gets_the_exception(tmp_path):
    jobs = Jobs(tmp_path / "jobs")
    err = NotFound("no snapshot 'x'", hint="list them: forkd snapshots")
    gate = Gate(raises=err)
    job = jobs.submit("snapshot.compaction", gate, target="y")
    gate.opened.set()
    done = _done(jobs, job.id)
    assert done.state == "failed"
    assert (done.error.status, done.error.type, done.error.detail, done.error.hint) == (
        404, "NotFound", "no snapshot 'x'", "list them: forkd snapshots")
    with pytest.raises(NotFound) as got:
        jobs.outcome(job.id)
    assert got.value is err


def test_at_most_limits_running_run_at_once_and_a_full_queue_is_busy(tmp_path):
    jobs = Jobs(tmp_path / "jobs", Limits(running=1, queued=1, keep=10))
    first, second = Gate("a"), Gate("b")
    a = jobs.submit("image.build", first)
    b = jobs.submit("image.build", second)
    assert first.started.wait(LONG)
    assert jobs.get(b.id).state == "queued" and not second.started.is_set()
    with pytest.raises(Busy):
        jobs.submit("image.build", Gate())
    first.opened.set()
    assert second.started.wait(LONG)  # started only once the first finished
    assert jobs.get(a.id).state == "succeeded"
    second.opened.set()
    assert _done(jobs, b.id).result == "b"


class Stoppable(Gate):
    """A Gate whose wait a cancel ends (as a stopped VMM ends a call into its guest); it then reports a phase,
    which is where a cancelled job's work stops."""

    def __call__(self, progress, cancel=None):
        with cancel.on_cancel(self.opened.set):
            answer = super().__call__(progress, cancel)
        progress("after the gate")
        return answer


def test_a_queued_job_is_cancelled_at_once_and_a_running_one_once_its_work_stops(tmp_path):
    jobs = Jobs(tmp_path / "jobs", Limits(running=1, queued=4, keep=10))
    running, queued = Stoppable(answer="built"), Gate()
    a, b = jobs.submit("image.build", running), jobs.submit("image.build", queued)
    assert running.started.wait(LONG)
    assert jobs.cancel(b.id).state == "cancelled"
    asked = jobs.cancel(a.id)
    assert (asked.state, asked.phase) == ("running", "cancelling")
    done = _done(jobs, a.id)
    assert (done.state, done.result, done.error) == ("cancelled", None, None), done
    assert jobs.get(b.id).state == "cancelled" and not queued.started.is_set()  # never ran
    with pytest.raises(Conflict, match="cancelled"):
        jobs.outcome(a.id)
    for finished in (a.id, b.id):
        with pytest.raises(Conflict, match=r"is cancelled: only a queued or running job"):
            jobs.cancel(finished)
    with pytest.raises(NotFound):
        jobs.cancel("job-ffffffffffffffff")


def test_a_job_past_its_last_check_when_cancelled_succeeds(tmp_path):
    """Work that never looks at its token again finishes: the cancel came too late, and the job says so."""
    jobs = Jobs(tmp_path / "jobs", Limits(running=1, queued=4, keep=10))
    gate = Gate(answer="built")
    job = jobs.submit("image.build", gate)
    assert gate.started.wait(LONG)
    assert jobs.cancel(job.id).phase == "cancelling"
    gate.opened.set()
    done = _done(jobs, job.id)
    assert (done.state, done.result) == ("succeeded", "built"), done
    with pytest.raises(Conflict, match="is succeeded"):
        jobs.cancel(job.id)


def test_the_limits_are_the_settings_and_a_bad_one_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKD_JOBS_RUNNING", "1")
    monkeypatch.setenv("FORKD_JOBS_QUEUED", "0")
    monkeypatch.setenv("FORKD_JOBS_KEPT", "7")
    assert Service.on(Layout(tmp_path / "home")).jobs.limits == Limits(running=1, queued=0, keep=7)
    jobs = Jobs(tmp_path / "jobs")
    gate = Gate()
    jobs.submit("image.build", gate)
    assert gate.started.wait(LONG)
    with pytest.raises(Busy):  # one running, none may wait
        jobs.submit("image.build", Gate())
    gate.opened.set()
    for name, bad in (("FORKD_JOBS_RUNNING", "0"), ("FORKD_JOBS_QUEUED", "-1"), ("FORKD_JOBS_KEPT", "0")):
        with monkeypatch.context() as env:
            env.setenv(name, bad)
            with pytest.raises(InvalidInput, match=name):
                Jobs(tmp_path / "jobs")


def test_the_newest_finished_jobs_are_kept(tmp_path):
    jobs = Jobs(tmp_path / "jobs", Limits(running=1, queued=4, keep=2))
    ids = []
    for n in range(3):
        gate = Gate(n)
        gate.opened.set()
        ids.append(jobs.submit("image.build", gate).id)
        _done(jobs, ids[-1])
    assert [j.id for j in jobs.list()] == ids[:0:-1]
    with pytest.raises(NotFound):
        jobs.get(ids[0])
    assert not (tmp_path / "jobs" / f"{ids[0]}.json").exists()


def test_a_restart_fails_the_jobs_it_cannot_finish_never_leaving_one_running(tmp_path):
    """The first table stands for a daemon that stopped mid-build: its records say running and queued."""
    dead = Jobs(tmp_path / "jobs", Limits(running=1, queued=4, keep=10))
    gate = Gate()
    a, b = dead.submit("snapshot.parent", gate, target="p"), dead.submit("snapshot.parent", Gate(), target="q")
    assert gate.started.wait(LONG)
    after = Jobs(tmp_path / "jobs")
    assert sorted(after.recover()) == sorted([a.id, b.id])
    for job in (after.get(a.id), after.get(b.id)):
        assert job.state == "failed" and job.error.detail.startswith(RESTARTED), job
        assert job.error.type == "Unavailable" and job.error.status == 503
    assert not [j for j in Jobs(tmp_path / "jobs").list() if j.state in ("queued", "running")]
    gate.opened.set()


def test_a_job_id_names_nothing_outside_the_jobs_directory_and_odd_records_are_skipped(tmp_path):
    root = tmp_path / "jobs"
    jobs = Jobs(root)
    jobs.list()  # makes the private directory
    (tmp_path / "job-0000000000000000.json").write_text(json.dumps({"id": "job-0000000000000000", "kind": "x",
                                                                     "state": "succeeded"}))
    os.symlink(tmp_path / "job-0000000000000000.json", root / "job-0000000000000000.json")  # not ours to follow
    (root / "job-1111111111111111.json").write_text("x" * (2 << 20))  # over the bound
    (root / "job-2222222222222222.json").write_text(json.dumps({"id": "job-2222222222222222"}))  # no state
    fresh = Jobs(root)
    assert fresh.list() == []
    for bad in ("../job-0000000000000000", "job-0000000000000000", "..", "job-2222222222222222"):
        with pytest.raises(NotFound):
            fresh.get(bad)


# -- the routes, on the fake driver --------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(fake_home, fake_base):
    s = Service.on(Layout(fake_home))
    with TestClient(create_app(s)) as c:
        yield c, s


def _finished(client, job: dict) -> dict:
    while job["state"] not in ("succeeded", "failed", "cancelled"):
        job = client.get(f"/v1/jobs/{job['id']}", params={"wait_secs": LONG, "since": job["version"]}).json()
    return job


def test_a_build_answers_202_and_its_job_then_the_snapshot(api):
    client, _ = api
    r = client.post("/v1/snapshots/build/compaction", json={"from_tag": BASE_TAG, "to_tag": "jobs-flat"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["Location"] == f"/v1/jobs/{job['id']}" and job["kind"] == "snapshot.compaction"
    assert job["target"] == "jobs-flat"
    done = _finished(client, job)
    assert done["state"] == "succeeded" and done["result"]["tag"] == "jobs-flat", done
    assert done["result"] == client.get("/v1/snapshots/jobs-flat").json()
    assert done["id"] in {j["id"] for j in client.get("/v1/jobs").json()}
    finished = client.delete(f"/v1/jobs/{done['id']}")  # nothing left to cancel
    assert finished.status_code == 409 and "succeeded" in finished.json()["detail"], finished.text
    assert client.delete("/v1/snapshots/jobs-flat").status_code == 204


def test_a_failed_build_job_names_the_cause_and_wait_true_answers_it_as_before(api):
    client, _ = api
    body = {"from_tag": "no-such-snapshot", "to_tag": "jobs-never"}
    done = _finished(client, client.post("/v1/snapshots/build/compaction", json=body).json())
    assert done["state"] == "failed" and done["error"]["status"] == 404 and done["error"]["type"] == "NotFound"
    assert "no-such-snapshot" in done["error"]["detail"]
    blocking = client.post("/v1/snapshots/build/compaction", json=body, params={"wait": "true"})
    assert blocking.status_code == 404 and blocking.json()["title"] == "NotFound"


@pytest.mark.parametrize("url,body,params", [
    ("/v1/snapshots/build/compaction", {"from_tag": BASE_TAG, "to_tag": "jobs-block"}, {"wait": "true"}),
    ("/v1/build/compaction", {"from_tag": BASE_TAG, "to_tag": "jobs-block"}, {}),  # deprecated: blocks as it did
    (f"/v1/snapshots/{BASE_TAG}/compact", {"to": "jobs-block"}, {}),  # upstream's: blocks as upstream's does
])
def test_the_blocking_ways_answer_the_snapshot(api, url, body, params):
    client, _ = api
    r = client.post(url, json=body, params=params)
    try:
        assert r.status_code == 201, r.text
        assert r.json()["tag"] == "jobs-block" and r.json()["status"] == "ready"
    finally:
        client.delete("/v1/snapshots/jobs-block")


def test_upstreams_compaction_with_wait_false_is_a_job(api):
    client, _ = api
    r = client.post(f"/v1/snapshots/{BASE_TAG}/compact", json={"to": "jobs-up"}, params={"wait": "false"})
    assert r.status_code == 202 and r.json()["kind"] == "snapshot.compaction"
    assert _finished(client, r.json())["result"]["tag"] == "jobs-up"
    client.delete("/v1/snapshots/jobs-up")


def test_a_daemon_start_fails_a_job_left_running(api, fake_home):
    """A record as a daemon killed mid-build leaves it; the next start's recovery (Service.recover, which `forkd
    serve` runs before it listens) ends it failed, and GET answers so."""
    client, _ = api
    rec = {"id": "job-abcdefabcdefabcd", "kind": "snapshot.parent", "state": "running", "target": "gone",
           "created_at": 1.0, "started_at": 2.0, "version": 2}
    (Layout(fake_home).jobs / f"{rec['id']}.json").write_text(json.dumps(rec))
    fresh = Service.on(Layout(fake_home))
    fresh.recover()
    with TestClient(create_app(fresh)) as c:
        got = c.get(f"/v1/jobs/{rec['id']}").json()
    assert got["state"] == "failed" and got["error"]["detail"].startswith(RESTARTED), got


def _vmm_roots(layout: Layout) -> list[str]:
    """The processes (the fake driver's VMMs and what their guests run) whose root is a build's run directory in
    this home (forkd.vmm.fake: each VM is chrooted into `<work dir>/root`)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                root = os.readlink(f"/proc/{d}/root")
            except OSError:
                continue
            if root.startswith(str(layout.tmp) + "/"):
                found.append(f"{d}: {root}")
    return found


def _left(layout: Layout) -> set[str]:
    return {p.name for p in layout.tmp.iterdir()} | {p.name for p in layout.scratch_dir().iterdir()}


@pytest.mark.parametrize("what,body", [
    ("parent", {"tag": "jobs-cancelled", "memory_mib": 128, "warm_run": ["exec sleep 600"]}),
    ("layer", {"tag": "jobs-cancelled", "parent_tag": BASE_TAG, "run": ["exec sleep 600"]}),
])
def test_cancelling_a_running_build_stops_its_vmm_and_leaves_nothing(api, fake_home, what, body):
    """A parent (or layer) build blocked in a warm-up command (one that would run for ten minutes) is cancelled:
    the DELETE answers it still running, "cancelling"; the build's VMM is stopped (so the command ends at once),
    the job ends cancelled, and no snapshot, staging directory, scratch memory or VMM process of it is left."""
    client, _ = api
    layout = Layout(fake_home)
    before = _left(layout)
    r = client.post(f"/v1/snapshots/build/{what}", json=body)
    assert r.status_code == 202, r.text
    job = r.json()
    while not (job.get("phase") or "").startswith("warming up: exec sleep"):  # the build is in its warm-up step
        assert job["state"] == "running", job
        job = client.get(f"/v1/jobs/{job['id']}", params={"wait_secs": LONG, "since": job["version"]}).json()
    assert _vmm_roots(layout), "the build's VMM is not running: nothing to stop"
    asked = client.delete(f"/v1/jobs/{job['id']}")
    assert asked.status_code == 200 and asked.json().get("phase") == "cancelling", asked.text
    done = client.get(f"/v1/jobs/{job['id']}", params={"wait_secs": LONG}).json()  # until it is finished
    assert done["state"] == "cancelled" and done.get("result") is None, done
    assert client.get("/v1/snapshots/jobs-cancelled").status_code == 404
    assert not layout.snapshot_dir("jobs-cancelled").exists()
    assert _left(layout) == before
    assert _vmm_roots(layout) == []
    again = client.delete(f"/v1/jobs/{job['id']}")
    assert again.status_code == 409 and "is cancelled" in again.json()["detail"], again.text
    assert client.delete("/v1/jobs/job-0123456789abcdef").status_code == 404


def test_a_cancel_during_a_step_stops_the_build_before_its_next_step(fake_rt, fake_base, fake_home):
    """In-process, with a token: a cancel that arrives while the boot runs (a step it cannot cut short) stops the
    build before its warm-up; the VMM the boot made is stopped and the snapshot removed."""
    token, said = CancelToken(), []

    def cancel_at_boot(line: str) -> None:
        said.append(line)
        if line.startswith("booting"):
            token.cancel("the test cancelled it")

    with pytest.raises(Cancelled, match="the test cancelled it"):
        fake_rt.create_snapshot(ParentBuild.of(tag="jobs-at-boot", memory_mib=128, warm_run=("true",)),
                                progress=cancel_at_boot, cancel=token)
    assert [line.split(" (")[0] for line in said] == ["booting the parent"]
    assert not Layout(fake_home).snapshot_dir("jobs-at-boot").exists() and _vmm_roots(Layout(fake_home)) == []


def test_a_cancel_in_the_last_step_stops_the_build_before_its_commit(fake_rt, fake_base, fake_home):
    """A compaction is one step, writing the snapshot's files: a cancel while it runs is seen at the check just
    before the commit, so the snapshot is not committed but removed."""
    token = CancelToken()
    with pytest.raises(Cancelled):
        fake_rt.compact(Compaction.of(from_tag=BASE_TAG, to_tag="jobs-late"),
                        progress=lambda line: token.cancel("late"), cancel=token)
    assert not Layout(fake_home).snapshot_dir("jobs-late").exists()
