"""Snapshot chains through an OCI registry (forkd.core.pack.oci) against a real registry on loopback
(tests.registries: Debian's docker-registry): pushed from one home, pulled by digest into another, every digest
verified; tampered blobs, a manifest that does not hash to its pin, path tricks in the pack and artifacts of another
shape are refused with nothing installed. Hand-made packs (tests.test_pack's) need no VM; the last test pushes a
snapshot built on the fake VMM driver (tests/fake_vmm.py) and forks a child from the pulled copy."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkd.base.errors import ForkdError, InvalidInput
from forkd.core.pack import PackError
from forkd.core.pack import oci as pack_oci
from forkd.core.requests import Spawn
from forkd.image.registry import RegistryOptions
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_pack import _drop, _empty_runtime, _fake_files, _good_members, _manifest, _reg, _write_pack

PLAIN = RegistryOptions(tls_verify=False)


@pytest.fixture
def target():
    rt2, d = _empty_runtime()
    yield rt2
    _drop(rt2, d)


def _publish(reg, tmp_path: Path, name: str, files: dict | None = None, members: list | None = None,
             **manifest) -> str:
    """Push a hand-made pack as an artifact to REGISTRY/name:v1; the pinned reference."""
    files = files or _fake_files()
    m = _manifest(files, created_at=name, **manifest)  # each test its own blobs: the registry shares equal ones
    pack_file = _write_pack(tmp_path / f"{name.replace('/', '_')}.tar.zst", m,
                            members if members is not None else _good_members(files))
    work = tmp_path / f"work-{name.replace('/', '_')}"
    work.mkdir()
    summary = {"head": m["head"], "chain": m["chain"], "image_id": m["image_id"]}
    digest = pack_oci.publish(pack_file, summary, f"{reg.host}/{name}:v1", PLAIN, work)
    return f"{reg.host}/{name}@{digest}"


def _blob_file(reg, digest: str) -> Path:
    """Where the registry stores the blob `digest` (its filesystem driver's layout)."""
    root = Path(reg.proc.args[2]).parent / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    hexd = digest.partition(":")[2]
    return root / hexd[:2] / hexd / "data"


def _nothing_installed(rt2) -> None:
    assert os.listdir(rt2.layout.snapshots) == [] and os.listdir(rt2.layout.images) == []
    assert os.listdir(rt2.layout.tmp) == []


def test_a_chain_pushed_is_pulled_by_digest_into_another_home(registry_http, target, tmp_path):
    pinned = _publish(registry_http, tmp_path, "forkd/fake")
    res = pack_oci.pull(target, pinned, PLAIN)
    digest = pinned.partition("@")[2]
    assert res["installed"] == ["images/img1", "evil"] and res["digest"] == digest
    snap = target.store.get("evil")
    assert snap.labels["forkd.dev/source"] == f"oci:{registry_http.host}/forkd/fake@{digest}"
    assert snap.vmstate_sha256 == hashlib.sha256(_fake_files()["snapshots/evil/vmstate"]).hexdigest()
    again = pack_oci.pull(target, pinned, PLAIN)  # idempotent: the same content is already there
    assert again["installed"] == [] and again["skipped"] == ["images/img1", "evil"]


def test_a_pull_by_tag_is_pinned_to_the_digest_it_resolved(registry_http, target, tmp_path):
    pinned = _publish(registry_http, tmp_path, "forkd/bytag")
    res = pack_oci.pull(target, f"docker://{registry_http.host}/forkd/bytag:v1", PLAIN)
    assert res["digest"] == pinned.partition("@")[2] and res["pinned"] == "docker://" + pinned


def test_a_tampered_pack_blob_in_the_registry_is_refused(registry_http, target, tmp_path):
    pinned = _publish(registry_http, tmp_path, "forkd/tampered-blob")
    manifest = json.loads(registry_http.manifest("forkd/tampered-blob", pinned.partition("@")[2]))
    blob = _blob_file(registry_http, manifest["layers"][0]["digest"])
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0xFF  # same size, other bytes
    blob.write_bytes(bytes(data))
    with pytest.raises(ForkdError, match=manifest["layers"][0]["digest"].partition(":")[2][:12]):
        pack_oci.pull(target, pinned, PLAIN)
    _nothing_installed(target)


def test_a_manifest_that_does_not_hash_to_the_pin_is_refused(registry_http, target, tmp_path):
    pinned = _publish(registry_http, tmp_path, "forkd/tampered-manifest")
    digest = pinned.partition("@")[2]
    stored = _blob_file(registry_http, digest)
    stored.write_bytes(stored.read_bytes().replace(b'"dev.forkd.head": "evil"', b'"dev.forkd.head": "evjl"'))
    with pytest.raises(InvalidInput, match=f"not the pinned {digest}"):
        pack_oci.pull(target, pinned, PLAIN)
    _nothing_installed(target)


def test_path_tricks_inside_a_pulled_pack_are_refused_by_the_unpacker(registry_http, target, tmp_path):
    files = _fake_files()
    pinned = _publish(registry_http, tmp_path, "forkd/traversal", files,
                      [_reg("../x", b"pwned"), *_good_members(files)])
    with pytest.raises(PackError, match="path traversal") as exc:
        pack_oci.pull(target, pinned, PLAIN)
    assert pinned.partition("@")[2] in exc.value.message
    _nothing_installed(target)
    assert not (target.layout.home.parent / "x").exists()


def test_reconciler_tags_need_an_owned_pull_by_digest(registry_http, target, tmp_path):
    """A pack holding a tag of the reconciler's shape is refused by a plain pull; an owned pull (the operator's,
    pinned) installs it with the owner labels its builder gave it; an owned pull by tag is refused."""
    files = {p.replace("evil", "web-0123456789"): b for p, b in _fake_files().items()}
    rec = json.loads(files["snapshots/web-0123456789/snapshot.json"])
    rec.update(tag="web-0123456789", labels={"forkd.dev/parent": "default/web", "forkd.dev/spec-hash": "ab" * 32})
    files["snapshots/web-0123456789/snapshot.json"] = json.dumps(rec).encode()
    pinned = _publish(registry_http, tmp_path, "forkd/owned", files, head="web-0123456789", chain=["web-0123456789"])
    with pytest.raises(PackError, match="reconciler owns"):
        pack_oci.pull(target, pinned, PLAIN)
    with pytest.raises(InvalidInput, match="must name a digest"):
        pack_oci.pull(target, f"{registry_http.host}/forkd/owned:v1", PLAIN, owned=True)
    _nothing_installed(target)
    pack_oci.pull(target, pinned, PLAIN, owned=True)
    labels = target.store.get("web-0123456789").labels
    assert labels["forkd.dev/parent"] == "default/web" and labels["forkd.dev/source"].startswith("oci:")


def _artifact(**over) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": pack_oci.MANIFEST_TYPE, "artifactType": pack_oci.ARTIFACT_TYPE,
           "config": {"mediaType": pack_oci.CONFIG_TYPE, "digest": "sha256:" + "a" * 64, "size": 10},
           "layers": [{"mediaType": pack_oci.PACK_TYPE, "digest": "sha256:" + "b" * 64, "size": 100}]}
    doc.update(over)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("over, match", [
    ({"artifactType": "application/vnd.oci.image.config.v1+json"}, "not a forkd snapshot artifact"),
    ({"mediaType": "application/vnd.oci.image.index.v1+json"}, "not a forkd snapshot artifact"),
    ({"layers": []}, "exactly one layer"),
    ({"layers": [{"mediaType": pack_oci.PACK_TYPE, "digest": "sha256:" + "b" * 64, "size": 100}] * 2},
     "exactly one layer"),
    ({"layers": [{"mediaType": pack_oci.PACK_TYPE, "digest": "sha256:" + "b" * 64, "size": 1 << 50}]},
     "at most"),
    ({"layers": [{"mediaType": pack_oci.PACK_TYPE, "digest": "sha512:" + "b" * 128, "size": 100}]},
     "malformed digest"),
    ({"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:" + "b" * 64,
                  "size": 100}]}, "media type"),
    ({"config": {"mediaType": pack_oci.CONFIG_TYPE, "digest": "sha256:" + "a" * 64, "size": 1 << 20}}, "at most"),
])
def test_artifacts_of_another_shape_are_refused_before_any_blob_is_read(over, match):
    raw = _artifact(**over)
    with pytest.raises(InvalidInput, match=match):
        pack_oci.check_manifest(raw, "sha256:" + hashlib.sha256(raw).hexdigest(), "REF")


def test_the_control_artifact_is_accepted():
    raw = _artifact()
    cfg, layer = pack_oci.check_manifest(raw, "sha256:" + hashlib.sha256(raw).hexdigest(), "REF")
    assert layer["size"] == 100 and cfg["size"] == 10


def _copy(tmp_path: Path) -> tuple[Path, str, list[dict]]:
    """A skopeo-style dir: copy with one blob, and its manifest's digest."""
    root = tmp_path / "copy"
    root.mkdir()
    blob = b"pack bytes" * 100
    d = {"mediaType": pack_oci.PACK_TYPE, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    (root / d["digest"][7:]).write_bytes(blob)
    raw = _artifact(layers=[d])
    (root / "manifest.json").write_bytes(raw)
    return root, "sha256:" + hashlib.sha256(raw).hexdigest(), [d]


def test_check_copy_accepts_a_faithful_copy(tmp_path):
    root, digest, descs = _copy(tmp_path)
    assert list(pack_oci.check_copy(root, digest, descs, "REF")) == [descs[0]["digest"]]


@pytest.mark.parametrize("case", ["flipped byte", "truncated", "symlink", "missing", "manifest edited"])
def test_check_copy_refuses_what_does_not_match_its_digests(tmp_path, case):
    root, digest, descs = _copy(tmp_path)
    blob = root / descs[0]["digest"][7:]
    if case == "flipped byte":
        data = bytearray(blob.read_bytes())
        data[3] ^= 1
        blob.write_bytes(bytes(data))
    elif case == "truncated":
        blob.write_bytes(blob.read_bytes()[:-1])
    elif case == "symlink":
        (tmp_path / "elsewhere").write_bytes(blob.read_bytes())
        blob.unlink()
        blob.symlink_to(tmp_path / "elsewhere")
    elif case == "missing":
        blob.unlink()
    else:
        (root / "manifest.json").write_bytes((root / "manifest.json").read_bytes() + b" ")
    with pytest.raises(InvalidInput, match="REF"):
        pack_oci.check_copy(root, digest, descs, "REF")


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forkd.cli.main", *args], capture_output=True, text=True,
                          env=dict(os.environ, FORKD_HOME=str(home), FORKD_NO_DAEMON="1"), timeout=600)


def test_cli_pull_names_the_digest_and_exits_2_on_a_mismatch(registry_http, target, tmp_path):
    pinned = _publish(registry_http, tmp_path, "forkd/cli")
    other = "sha256:" + "0" * 64
    wrong = pinned.partition("@")[0] + "@" + other
    res = _cli(target.layout.home, "snapshot", "pull", "--insecure-registry", wrong)
    assert res.returncode == 3 and other in res.stderr, res.stderr  # the registry has no such manifest
    res = _cli(target.layout.home, "snapshot", "pull", "--insecure-registry", pinned, "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["digest"] == pinned.partition("@")[2]
    res = _cli(target.layout.home, "snapshot", "pull", f"{registry_http.host}/forkd/cli@sha256:xyz")
    assert res.returncode == 2 and "malformed" in res.stderr, res.stderr
    assert "--insecure-registry" in _cli(target.layout.home, "snapshot", "pull", "--help").stdout
    res = _cli(target.layout.home, "snapshot", "push", "--insecure-registry", "nosuch", f"{registry_http.host}/x:v1")
    assert res.returncode == 3 and "nosuch" in res.stderr, res.stderr
    res = _cli(target.layout.home, "snapshot", "push", "nosuch", f"{registry_http.host}/x@sha256:{'0' * 64}")
    assert res.returncode == 2 and "name a tag" in res.stderr, res.stderr
    assert "artifact" in _cli(target.layout.home, "snapshot", "push", "--help").stdout


def test_a_pulled_snapshot_forks_a_child_that_has_the_parents_state(rt, base, registry_http, target):
    """A real snapshot pushed from the session's home, pulled by digest into an empty home, forks there."""
    pushed = pack_oci.push(rt, BASE_TAG, f"{registry_http.host}/forkd/base:v1", PLAIN)
    res = pack_oci.pull(target, pushed["pinned"], PLAIN)
    assert res["installed"][-1] == BASE_TAG and res["digest"] == pushed["digest"]
    assert target.store.get(BASE_TAG).memory_sha256 == rt.store.get(BASE_TAG).memory_sha256
    child = target.fork(Spawn.of(tag=BASE_TAG, n=1))[0]
    out = target.exec(child.id, ["cat", "/root/parent.txt"])
    assert out["stdout"].strip() == "parent", out
