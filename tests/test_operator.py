"""The kopf operator's handlers against a real node daemon on the fake VMM driver (tests/fake_vmm.py).

No Kubernetes API server can be installed on this machine, so these tests are a stand-in for it (not a real
one): they call the kopf handler functions directly with resource bodies shaped like the ones kopf passes
(apiVersion/kind/metadata with namespace, uid, generation/spec/status; a kopf.Patch; a logger) and merge the
status patch back into the body
the way the API server's status subresource would. Everything below the API server is real but the VMM: a `forkd
serve` daemon process on the module's FORKD_HOME, reached over its unix socket (FORKD_DAEMON_SOCKET), builds a
parent snapshot and forks children on the fake driver, which passes the same contract tests as QEMU (handlers,
reconciler and daemon are logic above the driver; what only a VM shows is tested in tests/k8s/test_operator_vm.py
and the other vm-marked modules). Kubernetes Events are caught where kopf's event API puts them (its
posting queue, which a running operator drains into the API server): the `k8s_events` fixture installs that queue.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import kopf
import pytest

from forkd.base.errors import NotFound
from forkd.operator import handlers
from forkd.reconciler.objects import MANAGED_BY
from tests.conftest import forkd_cli
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

LOG = logging.getLogger("test-operator")


# -- a stand-in for the API server ------------------------------------------------------------------------------
def resource(kind: str, name: str, spec: dict, namespace: str = "default", generation: int = 1) -> dict:
    plural = {"ForkParent": "forkparents", "ForkPool": "forkpools", "ForkClaim": "forkclaims"}[kind]
    return {"apiVersion": "forkd.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "generation": generation,
                         "resourceVersion": "1", "creationTimestamp": "2026-11-29T10:00:00Z",
                         "finalizers": [handlers.FINALIZER],
                         "selfLink": f"/apis/forkd.dev/v1alpha1/namespaces/{namespace}/{plural}/{name}",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": spec, "status": {}}


def merge(into: dict, patch: dict) -> dict:
    """RFC 7386 merge patch, as the API server applies kopf's patch to the status subresource."""
    out = dict(into)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def call(handler, body: dict, **kw) -> kopf.Patch:
    """Invoke a handler the way kopf does (keyword arguments), then apply its status patch to `body`."""
    patch = kopf.Patch()
    try:
        handler(body=body, spec=body["spec"], meta=body["metadata"], status=body["status"], patch=patch,
                logger=LOG, name=body["metadata"]["name"], namespace=body["metadata"]["namespace"],
                uid=body["metadata"]["uid"], **kw)
    finally:
        if "status" in patch:
            body["status"] = merge(body["status"], dict(patch["status"]))
    return patch


def condition(body: dict, type_: str) -> dict:
    return next((c for c in body["status"].get("conditions", []) if c["type"] == type_), {})


def reconcile_until(bodies: list[dict], done, timeout: float = 240, what: str = "condition") -> None:
    """The operator's timer: reconcile every body again until `done()`."""
    deadline = time.monotonic() + timeout
    while True:
        for b in bodies:
            call(handlers.reconcile, b)
        if done():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}: " + json.dumps(
            [b["status"] for b in bodies])[:2000]
        time.sleep(1.0)


@pytest.fixture
def k8s_events():
    """kopf's event queue, as a running operator has it (stand-in: the events stay here instead of reaching an
    API server). Yields drain() -> [(type, reason, message, involved object's name)]."""
    from kopf._core.engines import posting

    loop = asyncio.new_event_loop()
    queue: asyncio.Queue = asyncio.Queue()
    tokens = [posting.settings_var.set(kopf.OperatorSettings()), posting.event_queue_var.set(queue),
              posting.event_queue_loop_var.set(loop)]
    seen: list[tuple[str, str, str, str]] = []

    def drain() -> list[tuple[str, str, str, str]]:
        loop.run_until_complete(asyncio.sleep(0))  # the handler's thread-safe puts land in the queue
        while not queue.empty():
            e = queue.get_nowait()
            seen.append((e.type, e.reason, e.message, e.ref["name"]))
        return seen

    yield drain
    for var, token in zip((posting.settings_var, posting.event_queue_var, posting.event_queue_loop_var), tokens,
                          strict=True):
        var.reset(token)
    loop.close()


# -- a real node daemon -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node_daemon(home):
    log = open(home / "operator-daemon.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "forkd.api", "serve", "--interval", "1"],
                            env=dict(os.environ, FORKD_HOME=str(home)), stdout=log, stderr=log)
    sock = home / "forkd.sock"
    deadline = time.monotonic() + 120  # a bound on a hang, not a speed check
    while not sock.exists():
        assert proc.poll() is None, (home / "operator-daemon.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "daemon socket never appeared"
        time.sleep(0.05)
    old = os.environ.get("FORKD_DAEMON_SOCKET")
    os.environ["FORKD_DAEMON_SOCKET"] = str(sock)
    yield sock
    if old is None:
        os.environ.pop("FORKD_DAEMON_SOCKET", None)
    else:
        os.environ["FORKD_DAEMON_SOCKET"] = old
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def pool_children(rt, name: str) -> list:
    return [r for r in rt.children() if r.pool == name]


def running(rt, name: str) -> int:
    return sum(r.status == "running" and not r.claimed for r in pool_children(rt, name))


def test_pool_create_scale_delete(node_daemon, rt):
    """Create a ForkParent + ForkPool -> children running and the status says Ready with warm == target; change
    the pool's warm -> scaled (observedGeneration follows); delete -> the finalizer handler retires the children
    and removes the objects from the daemon."""
    parent = resource("ForkParent", "op-base", {"memoryMiB": 256, "warmup": {"imports": ["json"]}})
    pool = resource("ForkPool", "op-pool", {"from": "op-base", "warm": 2, "maxChildren": 8})
    try:
        # create: the first pass applies and reports Reconciling (nothing is built yet)
        call(handlers.reconcile, parent)
        call(handlers.reconcile, pool)
        assert condition(pool, "Ready")["status"] in ("False", "Unknown")
        assert condition(pool, "Reconciling")["status"] == "True"

        def pool_ready(warm: int, generation: int) -> bool:
            st = pool["status"]
            return (condition(pool, "Ready").get("status") == "True" and st.get("warm") == warm
                    and st.get("target") == warm and st.get("observedGeneration") == generation)

        reconcile_until([parent, pool], lambda: pool_ready(2, 1), what="pool Ready with 2 warm")
        assert condition(parent, "Ready")["status"] == "True" and parent["status"]["snapshot"].startswith("op-base-")
        assert parent["status"]["observedGeneration"] == 1
        assert pool["status"]["snapshot"] == parent["status"]["snapshot"]
        assert condition(pool, "Degraded")["status"] == "False"
        assert running(rt, "op-pool") == 2
        for r in pool_children(rt, "op-pool"):
            assert rt.ping(r.id)["child_id"] == r.id

        # a timer tick with nothing changed patches nothing (one tick first: the spawn's p50 may land just after
        # the pool turned Ready)
        call(handlers.reconcile, pool)
        assert "status" not in call(handlers.reconcile, pool)

        # the daemon's object says who manages it; the CLI sees it and may not overwrite it
        got = json.loads(forkd_cli("get", "pools", "op-pool", "-o", "json", check=True).stdout)
        assert got["metadata"]["annotations"][MANAGED_BY] == "operator"
        assert got["metadata"]["annotations"][handlers.NAMESPACE_KEY] == "default"
        res = forkd_cli("apply", "-f", "-", input="apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\n"
                        "metadata: {name: op-pool}\nspec: {from: op-base, warm: 5}\n")
        assert res.returncode == 4 and "managed by operator" in res.stderr, res.stderr
        assert json.loads(forkd_cli("get", "pools", "op-pool", "-o", "json").stdout)["spec"]["warm"] == 2

        # change replicas: the API server bumps the generation; the pool scales to 3
        pool["spec"] = dict(pool["spec"], warm=3)
        pool["metadata"]["generation"] = 2
        reconcile_until([parent, pool], lambda: pool_ready(3, 2), what="pool scaled to 3")
        assert running(rt, "op-pool") == 3

        # a ForkClaim takes a warm child; its status says which and how to reach it; deleting it kills the child
        claim = resource("ForkClaim", "op-claim", {"pool": "op-pool", "count": 1, "ttl": "10m"})
        reconcile_until([claim], lambda: condition(claim, "Ready").get("status") == "True", what="claim Ready")
        [child] = claim["status"]["children"]
        assert claim["status"]["node"] == "local" and child["status"] == "running" and child["agentSocket"]
        assert rt.ping(child["id"])["child_id"] == child["id"]
        call(handlers.release, claim)
        assert child["id"] not in {r.id for r in rt.children()}

        # delete: the finalizer's handler scales to zero, waits for the children, removes the objects
        children = {r.id for r in pool_children(rt, "op-pool")}
        call(handlers.release, pool)
        assert pool_children(rt, "op-pool") == []
        assert not [r for r in rt.children() if r.id in children]
        with pytest.raises(NotFound):
            handlers.daemon().get("ForkPool", "op-pool")
        call(handlers.release, pool)  # again (kopf retries): nothing left to do
        call(handlers.release, parent)
        with pytest.raises(NotFound):
            handlers.daemon().get("ForkParent", "op-base")
        # the parent's snapshot is collected by the daemon's reconciler once nothing uses it
        tag = parent["status"]["snapshot"]
        deadline = time.monotonic() + 30
        while any(s.tag == tag for s in rt.store.list()):
            assert time.monotonic() < deadline, f"snapshot {tag} was not released"
            time.sleep(0.5)
    finally:
        for kind, name in (("ForkPool", "op-pool"), ("ForkParent", "op-base")):
            try:
                handlers.daemon().delete(kind, name)
            except NotFound:
                pass
        left = [r.id for r in pool_children(rt, "op-pool")]
        if left:
            rt.kill(left)


def test_errors_and_ownership(node_daemon, rt, k8s_events):
    """Invalid spec -> PermanentError and Degraded/InvalidSpec; unreachable daemon -> TemporaryError; an object
    the CLI applied is refused (TemporaryError, condition Conflict) and left alone by the delete handler; the
    same name from another namespace is another object on the node (namespaces are real). No VM is started here
    (the pools' parent does not exist)."""
    bad = resource("ForkPool", "op-bad", {"from": "nowhere", "warm": 2}, generation=4)
    bad["spec"]["child"] = {"network": "bridged"}  # the CRD schema forbids it; the operator refuses it too
    with pytest.raises(kopf.PermanentError):
        call(handlers.reconcile, bad)
    assert condition(bad, "Degraded")["status"] == "True" and condition(bad, "Degraded")["reason"] == "InvalidSpec"
    assert condition(bad, "Ready")["status"] == "False" and bad["status"]["observedGeneration"] == 4
    long_name = resource("ForkParent", "x" * 60, {})
    with pytest.raises(kopf.PermanentError):
        call(handlers.reconcile, long_name)

    unreachable = resource("ForkPool", "op-nodaemon", {"from": "nowhere"})
    with pytest.raises(kopf.TemporaryError) as exc:
        call(handlers.reconcile, unreachable, backend=handlers.daemon(str(Path(node_daemon).parent / "no.sock")))
    assert exc.value.delay == handlers.RETRY
    assert condition(unreachable, "Ready")["reason"] == "DaemonError"

    # the CLI owns op-cli: the operator is refused and says so; its delete handler leaves it alone
    forkd_cli("apply", "-f", "-", check=True, input="apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\n"
              "metadata: {name: op-cli}\nspec: {from: nowhere, warm: 0}\n")
    try:
        theirs = resource("ForkPool", "op-cli", {"from": "nowhere", "warm": 1})
        with pytest.raises(kopf.TemporaryError, match="managed by cli"):
            call(handlers.reconcile, theirs)
        assert condition(theirs, "Degraded")["reason"] == "Conflict"
        call(handlers.release, theirs)
        assert handlers.daemon().get("ForkPool", "op-cli")[0].spec.warm == 0
    finally:
        forkd_cli("delete", "pool/op-cli", check=True)

    # one name from two namespaces on one node: two objects, each released on its own
    a = resource("ForkPool", "op-shared", {"from": "nowhere"}, namespace="team-a")
    b = resource("ForkPool", "op-shared", {"from": "nowhere"}, namespace="team-b")
    try:
        call(handlers.reconcile, a)
        assert condition(a, "Ready")["status"] == "False"  # SourceNotFound, from the daemon's status
        # the daemon's events become Kubernetes Events on the resource: Applied, then a Warning for the cause
        reconcile_until([a], lambda: ("Warning", "SourceNotFound") in [e[:2] for e in k8s_events()],
                        timeout=30, what="a Warning event SourceNotFound")
        events = k8s_events()
        assert ("Normal", "Applied") in [e[:2] for e in events] and {e[3] for e in events} == {"op-shared"}
        assert condition(a, "Stalled")["status"] == "True"
        call(handlers.reconcile, a)  # each daemon event is posted once
        assert len([e for e in k8s_events() if e[1] == "SourceNotFound"]) == 1
        call(handlers.reconcile, b)
        assert handlers.daemon().get("ForkPool", "team-b.op-shared")[0].metadata.namespace == "team-b"
        call(handlers.release, b)  # b's only: a's is kept
        assert handlers.daemon().get("ForkPool", "team-a.op-shared")
        with pytest.raises(NotFound):
            handlers.daemon().get("ForkPool", "team-b.op-shared")
        call(handlers.release, a)
        with pytest.raises(NotFound):
            handlers.daemon().get("ForkPool", "team-a.op-shared")
    finally:
        for ns in ("team-a", "team-b"):
            try:
                handlers.daemon().delete("ForkPool", f"{ns}.op-shared")
            except NotFound:
                pass


def test_handlers_registered_for_every_kind():
    """What `forkd operator` runs: create/update/resume/delete handlers and a timer per kind, in forkd.dev."""
    reg = handlers.register(kopf.OperatorRegistry())
    changing = [(h.id, h.selector.plural) for h in reg._changing.get_all_handlers()]
    timers = [(h.id, h.selector.plural, h.interval) for h in reg._spawning.get_all_handlers()]
    for plural in ("forkparents", "forklayers", "forkpools", "forkbranches", "forkclaims"):
        for hid in ("reconcile-create", "reconcile-update", "reconcile-resume", "release"):
            assert (hid, plural) in changing
        assert ("reconcile-timer", plural, handlers.INTERVAL) in timers
    for h in reg._changing.get_all_handlers():
        assert h.selector.group == "forkd.dev" and h.selector.version == "v1alpha1"
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    assert settings.persistence.finalizer == handlers.FINALIZER
    # a deletion waits for the resource's timer to exit: checked as often as the timer ticks, not kopf's 60 s
    assert settings.background.cancellation_polling <= handlers.INTERVAL
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
