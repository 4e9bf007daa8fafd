"""Real OCI registries on loopback for the tests: Debian's `docker-registry` (the CNCF distribution server) started
on a free 127.0.0.1 port with a temporary config, one over plain HTTP without authentication, one over TLS (a
self-signed certificate made here) with htpasswd users. Images are pushed with `skopeo copy oci:... docker://...`
from the OCI layouts of tests.oci_images. Nothing leaves this machine. The fixtures are session-wide (registered
in conftest.py) and skip when docker-registry, skopeo or htpasswd are missing (scripts/setup.sh --dev installs
them)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.oci_images import LAYER_TAR, _write_layout

USER, PASSWORD = "alice", "s3cret-for-tests"


@dataclass
class Registry:
    host: str            # 127.0.0.1:PORT
    tls: bool
    cert_dir: Path | None
    authfile: Path | None
    proc: subprocess.Popen

    def push(self, layout: Path, name: str) -> str:
        """Push the OCI layout to NAME on this registry; the digest of the manifest the registry holds (skopeo
        compresses uncompressed layers on the way, so it is not the layout's)."""
        dest = ["--dest-tls-verify=false"] if not self.tls else [f"--dest-cert-dir={self.cert_dir}"]
        if self.authfile:
            dest.append(f"--dest-authfile={self.authfile}")
        digestfile = layout.parent / f"pushed-{os.getpid()}-{name.replace('/', '_')}"
        subprocess.run(["skopeo", "copy", "--quiet", f"--digestfile={digestfile}", *dest, f"oci:{layout}",
                        f"docker://{self.host}/{name}"], check=True, capture_output=True, timeout=300)
        return digestfile.read_text().strip()

    def manifest(self, repo: str, digest: str) -> bytes:
        """The manifest bytes the registry serves for REPO@DIGEST, read over HTTP here (not through skopeo)."""
        assert not self.tls
        req = urllib.request.Request(f"http://{self.host}/v2/{repo}/manifests/{digest}", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(root: Path, tls: bool) -> Registry:
    for tool in ("docker-registry", "skopeo", "htpasswd", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh --dev installs it)")
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    host = f"127.0.0.1:{port}"
    cfg = {"version": 0.1, "log": {"level": "error"}, "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
           "http": {"addr": host, "secret": "test-only"}}
    cert_dir = authfile = None
    if tls:
        cert_dir = root / "certs"
        cert_dir.mkdir()
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(root / "key.pem"),
                        "-out", str(cert_dir / "ca.crt")], check=True, capture_output=True, timeout=60)
        htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True)
        (root / "htpasswd").write_text(htpasswd.stdout)
        cfg["http"]["tls"] = {"certificate": str(cert_dir / "ca.crt"), "key": str(root / "key.pem")}
        cfg["auth"] = {"htpasswd": {"realm": "forkd-tests", "path": str(root / "htpasswd")}}
        authfile = root / "auth.json"
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        authfile.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    (root / "config.yml").write_text(json.dumps(cfg))  # JSON is YAML
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                                stderr=log)
    _wait_ready(proc, host, tls, root)
    return Registry(host, tls, cert_dir, authfile, proc)


def _wait_ready(proc: subprocess.Popen, host: str, tls: bool, root: Path) -> None:
    """Until /v2/ answers (401 counts: the server is up), or the server exits."""
    import ssl
    ctx = ssl._create_unverified_context() if tls else None  # only to see that it listens
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"docker-registry exited {proc.returncode}: {(root / 'registry.log').read_text()}")
        try:
            urllib.request.urlopen(f"{'https' if tls else 'http'}://{host}/v2/", timeout=2, context=ctx)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.05)  # polling a condition (the port listens), with a deadline
    raise AssertionError(f"docker-registry on {host} did not answer in time")


def _stop(reg: Registry) -> None:
    reg.proc.terminate()
    try:
        reg.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reg.proc.kill()
        reg.proc.wait()


@pytest.fixture(scope="session")
def registry_http(tmp_path_factory):
    """A registry over plain HTTP, no authentication."""
    reg = _start(tmp_path_factory.mktemp("registry-http"), tls=False)
    yield reg
    _stop(reg)


@pytest.fixture(scope="session")
def registry_tls(tmp_path_factory):
    """A private registry: TLS with a self-signed certificate (its CA in `cert_dir`), htpasswd credentials (an
    auth.json for them in `authfile`)."""
    reg = _start(tmp_path_factory.mktemp("registry-tls"), tls=True)
    yield reg
    _stop(reg)


@pytest.fixture(scope="session")
def registry_layout(layers, tmp_path_factory):
    """The three test layers plus a fourth that marks the image as the registry one (so its content, hence its
    image, differs from the local layout's)."""
    from forkd.image import oci

    marker = oci.layer_tar([("etc/", None, 0o755), ("etc/from-registry.txt", b"pulled\n", 0o644)])
    return _write_layout(tmp_path_factory.mktemp("oci-reg") / "img", [*layers, (marker, LAYER_TAR)])
