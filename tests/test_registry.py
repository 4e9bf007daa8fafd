"""Guest images pulled from a registry (`docker://REF`), against real registries on loopback (tests.registries):
pinned by digest, verified after the pull, TLS verified by default, credentials from an authfile or where skopeo
looks for them, and registries a spec may name only when the operator allowed them."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from forkd.base.errors import InvalidInput, NotFound
from forkd.core import images as core_images
from forkd.image import oci, registry
from forkd.image.registry import RegistryOptions, dir_source, parse, pull, resolve
from tests.conftest import forkd_cli

INSECURE = {"tls_verify": False}


# ---------------------------------------------------------------- references (pure)
@pytest.mark.parametrize("ref, host, repo, tag, digest", [
    ("docker://python:3.12-slim", "docker.io", "python", "3.12-slim", None),
    ("docker://library/python", "docker.io", "library/python", None, None),
    ("docker://127.0.0.1:5000/a/b:v1", "127.0.0.1:5000", "127.0.0.1:5000/a/b", "v1", None),
    ("docker://localhost/x@sha256:" + "a" * 64, "localhost", "localhost/x", None, "sha256:" + "a" * 64),
    ("docker://ghcr.io/o/n:t@sha256:" + "b" * 64, "ghcr.io", "ghcr.io/o/n", "t", "sha256:" + "b" * 64),
])
def test_reference_parts(ref, host, repo, tag, digest):
    r = parse(ref)
    assert (r.host, r.repository, r.tag, r.digest) == (host, repo, tag, digest)
    assert r.text == ref


@pytest.mark.parametrize("ref", ["docker://", "docker://UPPER/x", "docker://a/b:", "docker://x@sha256:12",
                                 "docker://x@md5:" + "a" * 32, "docker://-rf/x", "docker://a b", "oci:/x",
                                 "docker://x/" + "a" * 600])
def test_malformed_references_refused_before_anything_runs(ref):
    with pytest.raises(InvalidInput):
        parse(ref)


# ---------------------------------------------------------------- plain HTTP registry
@pytest.mark.vm
def test_from_image_docker_ref_snapshot_records_the_pin(rt, fork, registry_http, registry_layout):
    digest = registry_http.push(registry_layout, "forkd/tiny:vm")
    ref = f"docker://{registry_http.host}/forkd/tiny:vm"
    snap, image, _ = core_images.from_image(rt, ref, "reg-img", memory_mib=512, registry=INSECURE)
    assert snap.labels["forkd.dev/image-digest"] == digest and snap.labels["forkd.dev/image-ref"] == ref
    assert snap.image_id == image.id
    (child,) = fork(1, tag="reg-img")
    r = rt.exec(child.id, ["cat", "/etc/from-registry.txt", "/etc/added.txt"])
    assert r["stdout"] == "pulled\nadded in layer 2\n", r


def test_pull_builds_an_image_pinned_to_the_registry_digest(rt, registry_http, registry_layout):
    digest = registry_http.push(registry_layout, "forkd/tiny:1")
    ref = f"docker://{registry_http.host}/forkd/tiny:1"
    image, built = core_images.build_oci(rt, ref, memory_mib=512, any_path=True, registry=INSECURE)
    src = image.meta["source"]
    assert built and src["kind"] == "registry" and src["ref"] == ref
    assert src["digest"] == src["manifest"] == digest
    served = registry_http.manifest("forkd/tiny", digest)
    assert "sha256:" + hashlib.sha256(served).hexdigest() == digest
    assert src["layers"] == [d["digest"] for d in json.loads(served)["layers"]]
    # the same digest by pin is the same image, from the cache; a moved tag is a new image
    pinned, again = core_images.build_oci(rt, f"docker://{registry_http.host}/forkd/tiny@{digest}", memory_mib=512,
                                          any_path=True, registry=INSECURE)
    assert not again and pinned.id == image.id


def test_plain_http_registry_refused_unless_allowed(rt, registry_http, registry_layout):
    registry_http.push(registry_layout, "forkd/tiny:http")
    with pytest.raises(InvalidInput, match="HTTP") as exc:
        core_images.build_oci(rt, f"docker://{registry_http.host}/forkd/tiny:http", any_path=True)
    assert "--insecure-registry" in exc.value.hint


def test_cli_refuses_a_plain_http_registry_and_options_for_a_path(registry_http, registry_layout, layout_dir):
    """`forkd from-image` (the real CLI, in-process backend): exit 2 (InvalidInput) and the flag to use, before any
    VM boots."""
    registry_http.push(registry_layout, "forkd/tiny:cli")
    res = forkd_cli("from-image", f"docker://{registry_http.host}/forkd/tiny:cli", "--tag", "cli-reg")
    assert res.returncode == 2 and "--insecure-registry" in res.stderr, res.stderr
    res = forkd_cli("from-image", str(layout_dir), "--tag", "cli-path", "--insecure-registry")
    assert res.returncode == 2 and "docker://... references only" in res.stderr, res.stderr


def test_wrong_digest_refused(rt, registry_http, registry_layout):
    registry_http.push(registry_layout, "forkd/tiny:pin")
    wrong = "sha256:" + hashlib.sha256(b"not this image").hexdigest()
    with pytest.raises(NotFound, match="manifest unknown"):
        core_images.build_oci(rt, f"docker://{registry_http.host}/forkd/tiny@{wrong}", any_path=True,
                              registry=INSECURE)


def test_pulled_copy_is_verified_against_the_pin(rt, registry_http, registry_layout, layout_dir, tmp_path):
    """The pull takes the digest resolved, even when the tag moved since; what skopeo wrote is checked again before
    it is unpacked: the manifest against the pinned digest, the config and each layer against theirs."""
    digest = registry_http.push(registry_layout, "forkd/tiny:verify")
    pinned = resolve(f"docker://{registry_http.host}/forkd/tiny:verify", RegistryOptions(tls_verify=False))
    assert registry_http.push(layout_dir, "forkd/tiny:verify") != digest  # the tag now names another image
    src = pull(pinned, tmp_path / "pull")
    served = json.loads(registry_http.manifest("forkd/tiny", digest))
    assert pinned.manifest == digest and [la.digest for la in src.layers] == [d["digest"] for d in served["layers"]]
    other = "sha256:" + "0" * 64
    with pytest.raises(InvalidInput, match="not the pinned"):
        dir_source(tmp_path / "pull", other, "test")
    for what, blob_digest in [("config", served["config"]["digest"]), ("layer", src.layers[-1].digest)]:
        copy = tmp_path / what
        shutil.copytree(tmp_path / "pull", copy)
        blob = copy / blob_digest.partition(":")[2]
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        with pytest.raises(InvalidInput, match="hash to its digest|is corrupt"):
            oci.unpack(dir_source(copy, pinned.manifest, "test"), tmp_path / f"root-{what}")


# ---------------------------------------------------------------- private registry: TLS + credentials
def test_private_registry_needs_its_ca_and_credentials(rt, registry_tls, registry_layout, monkeypatch):
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    registry_tls.push(registry_layout, "private/tiny:1")
    ref = f"docker://{registry_tls.host}/private/tiny:1"
    with pytest.raises(InvalidInput, match="certificate|x509") as exc:  # self-signed: not trusted by default
        resolve(ref, RegistryOptions(authfile=str(registry_tls.authfile)))
    assert "--cert-dir" in exc.value.hint
    with pytest.raises(InvalidInput, match="unauthorized|authentication required") as exc:
        resolve(ref, RegistryOptions(cert_dir=str(registry_tls.cert_dir)))
    assert "--authfile" in exc.value.hint
    image, _ = core_images.build_oci(rt, ref, memory_mib=512, any_path=True,
                                     registry={"cert_dir": str(registry_tls.cert_dir),
                                               "authfile": str(registry_tls.authfile)})
    assert image.meta["source"]["kind"] == "registry"
    # the usual places: skopeo finds $REGISTRY_AUTH_FILE without a flag
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(registry_tls.authfile))
    assert resolve(ref, RegistryOptions(cert_dir=str(registry_tls.cert_dir))).digest == \
        image.meta["source"]["digest"]


def test_missing_authfile_named():
    with pytest.raises(NotFound, match="--authfile /nonexistent/auth.json"):
        RegistryOptions(authfile="/nonexistent/auth.json")


# ---------------------------------------------------------------- specs
def test_spec_pulls_only_from_registries_the_operator_allowed(rt, registry_http, registry_layout, monkeypatch):
    registry_http.push(registry_layout, "forkd/tiny:spec")
    ref = f"docker://{registry_http.host}/forkd/tiny:spec"
    monkeypatch.delenv("FORKD_IMAGE_REGISTRIES", raising=False)
    with pytest.raises(InvalidInput, match="not one specs may pull from") as exc:
        core_images.ensure_image(rt, {"oci": {"ref": ref}}, memory_mib=512)
    assert f"FORKD_IMAGE_REGISTRIES={registry_http.host}" in exc.value.hint
    monkeypatch.setenv("FORKD_IMAGE_REGISTRIES", registry_http.host)
    with pytest.raises(InvalidInput, match="HTTP"):  # allowed, but TLS is still verified
        core_images.ensure_image(rt, {"oci": {"ref": ref}}, memory_mib=512)
    monkeypatch.setenv("FORKD_INSECURE_REGISTRIES", registry_http.host)
    image_id = core_images.ensure_image(rt, {"oci": {"ref": ref}}, memory_mib=512)
    cli_built, _ = core_images.build_oci(rt, ref, memory_mib=512, any_path=True, registry=INSECURE)
    assert image_id == cli_built.id


def test_registry_options_refused_for_a_path(rt, layout_dir):
    with pytest.raises(InvalidInput, match="docker://"):
        core_images.build_oci(rt, str(layout_dir), any_path=True, registry=INSECURE)


def test_skopeo_missing_is_named(monkeypatch):
    monkeypatch.setattr(registry, "SKOPEO", "/nonexistent/skopeo")
    with pytest.raises(Exception, match="skopeo is not installed"):
        resolve("docker://127.0.0.1:1/x:1")
