"""Stores survive the upgrade: a $FORKD_HOME written by the previous release is opened by this code.

The previous release is commit OLD_COMMIT, the last one before the home carried a format version (so its homes are
version 1). Its `forkd` package is taken out of this repository's history (`git archive`) and run in a subprocess
(PYTHONPATH=<that tree>, the same interpreter) to fill a home the way a user of that release did: a ForkParent, a
ForkLayer on it and a ForkPool applied through the daemon's API (so the hash-chained audit log gets the API's and
the reconciler's entries), a warm pool child of the parent, and a child spawned from the layer. Then this tree's
CLI opens that home: the format is migrated to the current version, the snapshots are ready and their chain
verifies, the old children still answer, a new child forks from the old layer, the objects keep their specs, and
`forkd audit verify` passes.

If you change the on-disk layout: add a step to forkd.base.format.MIGRATIONS; this test must pass unchanged (it
asserts behaviour, never the current layout), and a change the steps miss is what makes it fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from forkd.base import format as fmt
from forkd.base.errors import Conflict, ForkdError, InvalidInput
from forkd.base.paths import Layout
from tests.conftest import forkd_cli, qemu_pids, remove_stale_flat_dirs

REPO = Path(__file__).resolve().parent.parent
OLD_COMMIT = "477d07d"  # README: disk-backed figures ... (the last commit before format.json)
LOCAL_ONLY = ("FORKD_URL", "FORKD_TOKEN", "FORKD_CONTEXT", "FORKD_DAEMON_SOCKET")  # every verb runs on the home

PARENT = {"kind": "ForkParent", "metadata": {"name": "up-parent"},
          "spec": {"memoryMiB": 256, "warmup": {"imports": ["decimal"], "exec": ["MARK = 'old'"],
                                                "run": ["echo parent > /root/parent.txt"]}}}
LAYER = {"kind": "ForkLayer", "metadata": {"name": "up-layer"},
         "spec": {"from": "up-parent", "run": ["echo layer > /root/layer.txt"], "imports": ["json"]}}
POOL = {"kind": "ForkPool", "metadata": {"name": "up-pool"}, "spec": {"from": "up-parent", "warm": 1, "maxChildren": 2}}

# Run by the OLD code (cwd = its tree): fills $FORKD_HOME through the daemon's own wiring, prints one RESULT line.
OLD_SCRIPT = """
import json, sys
from pathlib import Path

import forkd
assert Path(forkd.__file__).resolve().is_relative_to(Path.cwd().resolve()), f"not the old tree: {forkd.__file__}"
from starlette.testclient import TestClient

from forkd.api.app import create_app
from forkd.api.daemon import _audit_hook
from forkd.base.paths import Layout
from forkd.core.audit import AuditLog, verify
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.reconciler.engine import Reconciler

docs = json.loads(sys.argv[1])
plural = {"ForkParent": "parents", "ForkLayer": "layers", "ForkPool": "pools"}
layout = Layout.from_env()
rt = Runtime(layout)
audit = AuditLog(layout.home)
control = Control(rt, reconciler=Reconciler(rt, on_action=_audit_hook(audit)))
api = TestClient(create_app(control, audit=audit))


def call(method, path, **kw):
    r = api.request(method, path, **kw)
    assert r.status_code < 300, (method, path, r.status_code, r.text)
    return r.json()


for doc in docs:
    call("POST", f"/v1/{plural[doc['kind']]}", json=doc)
ok, problems = control.reconciler.run_until_converged(1200, [(d["kind"], d["metadata"]["name"]) for d in docs])
assert ok, problems
objects = {d["kind"]: call("GET", f"/v1/{plural[d['kind']]}/{d['metadata']['name']}") for d in docs}
layer_tag = objects["ForkLayer"]["status"]["snapshot"]
spawned = call("POST", "/v1/sandboxes", json={"snapshot_tag": layer_tag, "n": 1, "timeout_secs": 300})
print("RESULT " + json.dumps({
    "parent": objects["ForkParent"]["status"]["snapshot"], "layer": layer_tag, "layer_child": spawned[0]["id"],
    "pool_children": [c.id for c in rt.children() if c.pool == "up-pool"],
    "objects": {k: {"name": o["metadata"]["name"], "spec": o["spec"]} for k, o in objects.items()},
    "audit_lines": verify(layout.home).lines}))
"""


@dataclass(frozen=True)
class OldHome:
    home: Path
    parent: str
    layer: str
    layer_child: str
    pool_children: list[str]
    objects: dict[str, dict]
    audit_lines: int

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """This tree's `forkd` on the old home."""
        return _cli(self.home, *args, check=check)


def _env(home: Path, pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_ONLY}
    path = [str(pythonpath), str(pythonpath / "sdk" / "python")]  # that tree's forkd_client, not the one installed
    return dict(env, FORKD_HOME=str(home), PYTHONPATH=os.pathsep.join(path))


def _cli(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                         env=_env(home, REPO), cwd=REPO, timeout=900)
    if check and res.returncode != 0:
        raise AssertionError(f"forkd {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
    return res


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=120)


def _old_tree(dest: Path) -> Path:
    """The previous release's `forkd` package, out of this repository's history."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: the previous release ({OLD_COMMIT}) comes from its history")
    if _git("cat-file", "-e", f"{OLD_COMMIT}^{{commit}}").returncode != 0:
        if _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
            pytest.skip(f"shallow clone without {OLD_COMMIT}: run 'git fetch --unshallow' to test the upgrade")
        pytest.fail(f"commit {OLD_COMMIT} (the previous release) is not in {REPO}'s history")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", OLD_COMMIT, "forkd"],
                             capture_output=True, check=True, timeout=120).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _seed_image(session_home: Path, home: Path) -> None:
    """The session's default image, Debian packages and accelerator decision: the old code reuses the image when
    its builder computes the same id, else builds its own from the packages (no download either way)."""
    forkd_cli("image", "build", check=True)
    src = Layout(session_home)
    image_id = (src.images / "default").read_text().strip()
    (home / "images").mkdir(parents=True)
    shutil.copytree(src.images / image_id, home / "images" / image_id, copy_function=_link_or_copy)
    shutil.copy(src.images / "default", home / "images" / "default")
    shutil.copytree(src.debs, home / "cache" / "debs", copy_function=_link_or_copy)
    if src.accel_cache.exists():
        shutil.copy(src.accel_cache, home / "cache" / "accel.json")


@pytest.fixture(scope="module")
def old(home) -> OldHome:
    """A home filled by the previous release (its children left running), removed after the module."""
    work = Path(tempfile.mkdtemp(prefix="fkup", dir="/tmp"))
    old_home = work / "home"
    try:
        tree = _old_tree(work / "old")
        _seed_image(home, old_home)
        res = subprocess.run([sys.executable, "-c", OLD_SCRIPT, json.dumps([PARENT, LAYER, POOL])],
                             capture_output=True, text=True, env=_env(old_home, tree), cwd=tree, timeout=1800)
        result = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        assert res.returncode == 0 and result, f"the old code failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        made = OldHome(old_home, **json.loads(result[-1][len("RESULT "):]))
        assert not (old_home / fmt.FILE_NAME).exists(), "the old release wrote no format file: this home is version 1"
        assert made.audit_lines > 0 and len(made.pool_children) == 1
        yield made
    finally:
        if (old_home / "children").is_dir():
            _cli(old_home, "kill", "--all", check=False)
        leaked = qemu_pids(old_home)
        for pid in leaked:
            os.kill(pid, 9)
        shutil.rmtree(Layout(old_home).flat_cache.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        remove_stale_flat_dirs()
    assert not leaked, f"QEMU processes leaked: {leaked}"


def _contains(have, want) -> bool:
    """`have` holds everything `want` does (new code may add defaulted fields, never drop or change one)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _contains(have[k], v) for k, v in want.items())
    return have == want


@pytest.mark.vm
def test_old_home_is_migrated_to_the_current_format(old):
    snaps = {s["tag"]: s for s in json.loads(old.cli("snapshots", "-o", "json").stdout)}
    assert json.loads((old.home / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT}
    assert snaps[old.parent]["status"] == "ready" and snaps[old.layer]["status"] == "ready"
    assert snaps[old.parent]["memory_mib"] == 256


@pytest.mark.vm
def test_old_chain_verifies(old):
    info = json.loads(old.cli("snapshot-info", old.layer, "-o", "json").stdout)
    assert info["chain_ok"], info.get("chain_error")
    assert info["ancestors"] == [old.parent] and info["depth"] == 1


@pytest.mark.vm
def test_old_children_are_listed_answer_and_die(old):
    listed = {c["id"]: c for c in json.loads(old.cli("ls", "-o", "json").stdout)}
    for cid, tag, marker in [(old.layer_child, old.layer, "layer"), (old.pool_children[0], old.parent, "parent")]:
        assert listed[cid]["status"] == "running" and listed[cid]["snapshot"] == tag
        assert old.cli("exec", cid, "--", "cat", f"/root/{marker}.txt").stdout == f"{marker}\n"
        assert json.loads(old.cli("eval", cid, "MARK", "-o", "json").stdout)["value"] == "'old'"
        old.cli("kill", cid)
    left = {c["id"] for c in json.loads(old.cli("ls", "-o", "json").stdout)}
    assert not left & {old.layer_child, *old.pool_children}


@pytest.mark.vm
def test_new_child_forks_from_the_old_layer(old):
    out = json.loads(old.cli("fork", "-t", old.layer, "-n", "1", "--timeout", "300", "-o", "json").stdout)
    (child,) = out["children"]
    try:
        res = old.cli("exec", child["id"], "--", "cat", "/root/parent.txt", "/root/layer.txt")
        assert res.stdout == "parent\nlayer\n"
        assert json.loads(old.cli("eval", child["id"], "MARK", "-o", "json").stdout)["value"] == "'old'"
    finally:
        old.cli("kill", child["id"])


@pytest.mark.vm
def test_old_objects_keep_their_specs(old):
    for kind, resource in [("ForkParent", "parents"), ("ForkLayer", "layers"), ("ForkPool", "pools")]:
        doc = json.loads(old.cli("get", resource, old.objects[kind]["name"], "-o", "json").stdout)
        assert doc["kind"] == kind
        assert _contains(doc["spec"], old.objects[kind]["spec"]), (doc["spec"], old.objects[kind]["spec"])
    assert json.loads(old.cli("get", "layers", "up-layer", "-o", "json").stdout)["status"]["snapshot"] == old.layer


@pytest.mark.vm
def test_old_audit_log_verifies(old):
    res = old.cli("audit", "verify")
    lines = int(res.stdout.split("OK: ", 1)[1].split()[0])
    assert lines >= old.audit_lines


# -- the format file alone (no VM) -----------------------------------------------------------------------------------
def test_a_new_home_is_stamped_with_the_current_version(tmp_path):
    Layout(tmp_path / "h").ensure()
    assert json.loads((tmp_path / "h" / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT}


def test_a_home_without_the_file_is_version_1_and_migrated(tmp_path):
    (tmp_path / "snapshots" / "t").mkdir(parents=True)
    (tmp_path / "snapshots" / "t" / "snapshot.json").write_text("{}")
    Layout(tmp_path).ensure()
    Layout(tmp_path).ensure()  # idempotent
    assert json.loads((tmp_path / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT}
    assert (tmp_path / "snapshots" / "t" / "snapshot.json").read_text() == "{}"


def test_a_home_opened_by_many_at_once_is_migrated_once(tmp_path):
    (tmp_path / "objects").mkdir()
    with ThreadPoolExecutor(8) as pool:  # file_lock excludes threads as it does processes
        list(pool.map(lambda _: Layout(tmp_path).ensure(), range(16)))
    assert json.loads((tmp_path / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT}


def test_a_failed_step_leaves_the_last_version_and_resumes(tmp_path, monkeypatch):
    """Stamped after each step: a step that fails (or a crash in it) is run again on the next open."""
    attempts = []

    def step(home: Path) -> None:
        attempts.append(home)
        if len(attempts) == 1:
            raise OSError("disk full")

    monkeypatch.setattr(fmt, "MIGRATIONS", (*fmt.MIGRATIONS, (fmt.CURRENT, step)))
    monkeypatch.setattr(fmt, "CURRENT", fmt.CURRENT + 1)
    (tmp_path / "snapshots").mkdir()
    with pytest.raises(ForkdError) as err:
        Layout(tmp_path).ensure()
    assert f"from format version {fmt.CURRENT - 1} to {fmt.CURRENT} failed: disk full" in err.value.message
    assert json.loads((tmp_path / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT - 1}
    Layout(tmp_path).ensure()
    assert json.loads((tmp_path / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT}
    assert len(attempts) == 2


def test_version_2_objects_move_into_the_default_namespace(tmp_path):
    """Format 3 keys objects by namespace: objects/<Kind>/<name>.json (and its events) of a version-2 home move to
    objects/<Kind>/default/, where the object store finds them under their old names; a second run moves nothing."""
    from forkd.reconciler.objects import ObjectStore

    (tmp_path / fmt.FILE_NAME).write_text(json.dumps({"version": 2}))
    doc = {"apiVersion": "forkd.dev/v1alpha1", "kind": "ForkPool", "metadata": {"name": "old-pool", "generation": 3},
           "spec": {"from": "py", "warm": 2}}
    kind_dir = tmp_path / "objects" / "ForkPool"
    kind_dir.mkdir(parents=True)
    (kind_dir / "old-pool.json").write_text(json.dumps({"document": doc, "applyset": "s", "source": "f.yaml:1"}))
    (kind_dir / "old-pool.events.jsonl").write_text(json.dumps({"time": 1.0, "type": "Normal", "reason": "Applied",
                                                                "message": "created"}) + "\n")
    (tmp_path / "objects" / ".claims").mkdir()
    (tmp_path / "objects" / ".claims" / "c1.json").write_text("{}")
    Layout(tmp_path).ensure()
    Layout(tmp_path).ensure()  # idempotent
    assert json.loads((tmp_path / fmt.FILE_NAME).read_text()) == {"version": fmt.CURRENT}
    assert sorted(p.name for p in (kind_dir / "default").iterdir()) == ["old-pool.events.jsonl", "old-pool.json"]
    assert not (kind_dir / "old-pool.json").exists()
    assert (tmp_path / "objects" / ".claims" / "c1.json").exists()  # claim records keep their (qualified) names
    store = ObjectStore(Layout(tmp_path))
    st = store.get("ForkPool", "old-pool")
    assert (st.obj.metadata.namespace, st.obj.metadata.generation, st.obj.spec.warm) == ("default", 3, 2)
    assert [e["reason"] for e in store.events("ForkPool", "old-pool")] == ["Applied"]
    assert [x.obj.metadata.name for x in store.list("ForkPool", "default")] == ["old-pool"]


def test_migration_steps_are_one_per_version_in_order():
    assert [start for start, _ in fmt.MIGRATIONS] == list(range(fmt.FIRST, fmt.CURRENT))


def test_a_home_from_a_newer_forkd_is_refused(tmp_path):
    (tmp_path / fmt.FILE_NAME).write_text(json.dumps({"version": fmt.CURRENT + 1}))
    with pytest.raises(Conflict) as err:
        Layout(tmp_path).ensure()
    assert str(tmp_path / fmt.FILE_NAME) in err.value.message and "upgrade forkd" in err.value.hint
    assert sorted(os.listdir(tmp_path)) == [fmt.FILE_NAME]  # nothing written into it
    res = _cli(tmp_path, "snapshots", check=False)
    assert res.returncode == Conflict.exit_code, res.stderr
    said = "".join(res.stderr.split())  # the console may wrap a long path
    assert fmt.FILE_NAME in said and "upgradeforkd" in said


@pytest.mark.parametrize("text", ["{", '{"version": "2"}', '{"version": 0}', "[2]"])
def test_an_unreadable_format_file_is_named(tmp_path, text):
    (tmp_path / fmt.FILE_NAME).write_text(text)
    with pytest.raises(InvalidInput) as err:
        Layout(tmp_path).ensure()
    assert str(tmp_path / fmt.FILE_NAME) in err.value.message
