"""The node image, built for real (scripts/build-image.sh: mmdebstrap base, podman build) and run the way
deploy/kubernetes/daemonset.yaml says (tests/k8s/podrun.py: its init containers, then the daemon; podman and runc,
privileged, host PID, host network), on a store of the test's own.

Slow (minutes: the first build runs mmdebstrap; later builds reuse the base), so it runs only with
FORKD_TEST_IMAGE=1, and is skipped where podman, runc or mmdebstrap is missing or the user is not root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.client.backends import RemoteBackend
from tests.k8s import podrun
from tests.k8s.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
MISSING = [t for t in ("podman", "runc", "mmdebstrap") if shutil.which(t) is None]
pytestmark = [
    pytest.mark.vm,  # doctor's accelerator probe boots QEMU; the pool test forks real children
    pytest.mark.skipif(os.environ.get("FORKD_TEST_IMAGE") != "1",
                       reason="builds and runs the node image (minutes): set FORKD_TEST_IMAGE=1"),
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (apt-get install podman runc mmdebstrap)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="podman's storage and privileged containers need root"),
]
POOL = """apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: img-base}
spec: {memoryMiB: 256}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: img-pool}
spec: {from: img-base, warm: 1, maxChildren: 4}
"""


@pytest.fixture(scope="module")
def image() -> str:
    res = subprocess.run([str(ROOT / "scripts" / "build-image.sh"), "localhost/forkd:test"], capture_output=True,
                         text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def node(image):
    """The DaemonSet's pod on a store of its own: init containers (sysctl, guest image build), then the daemon."""
    store = Path(tempfile.mkdtemp(prefix="fkimg", dir="/var/tmp"))
    debs = Layout.from_env().cache / "debs"  # the host's Debian package cache, if any: fewer downloads
    if debs.is_dir():
        shutil.copytree(debs, Layout(store).cache / "debs")
    store.chmod(0o700)
    name = f"forkd-node-{store.name}"
    podrun.run_init(image, store, name)
    podrun.start_main(image, store, name)
    sock = Layout(store).daemon_socket
    wait_for("the daemon's socket", sock.exists, timeout=60)
    yield name, store
    podrun.exec_(name, "forkd", "delete", "pool/img-pool", "parent/img-base")
    podrun.exec_(name, "forkd", "kill", "--all")
    podrun.stop(name)
    shutil.rmtree(store, ignore_errors=True)


def vmm_pid(child: str) -> int | None:
    """The pid of the QEMU process of `child` (its -name names it), seen from the host."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"process=forkd-{child}".encode() in b" ".join(argv):
                return int(proc.name)
    return None


def test_daemon_in_the_image_answers(node):
    """`forkd doctor` passes inside the container (no FAIL), and the daemon answers over the store's socket from
    outside it, as the operator does on its node (GET /v1/node)."""
    name, store = node
    res = podrun.exec_(name, "forkd", "doctor", "-o", "json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads(res.stdout)}
    assert not [c for c in checks.values() if c["status"] == "FAIL"]
    for tool in ("qemu", "cgroup", "netns", "security:egress", "security:unprivileged-uffd"):
        assert checks[tool]["status"] == "PASS", checks[tool]
    cap = RemoteBackend(str(Layout(store).daemon_socket)).capacity()
    assert cap["memoryAvailableMiB"] > 0 and cap["childrenRunning"] == 0


def test_pool_warm_and_claim_in_the_container(node):
    """A pool applied inside the container becomes warm, a claimed child answers an exec."""
    name, store = node
    res = podrun.exec_(name, "forkd", "apply", "-f", "-", input=POOL)
    assert res.returncode == 0, res.stderr
    backend = RemoteBackend(str(Layout(store).daemon_socket))
    wait_for("img-pool warm", lambda: (st := backend.get("ForkPool", "img-pool")[0].status) and st.warm == 1,
             timeout=900)
    res = podrun.exec_(name, "forkd", "claim", "img-pool", "-o", "json")
    assert res.returncode == 0, res.stderr
    [child] = json.loads(res.stdout)["children"]
    res = podrun.exec_(name, "forkd", "exec", child["id"], "--", "echo", "from-the-pod")
    assert res.returncode == 0 and "from-the-pod" in res.stdout, res.stderr


def test_restart_leaves_children_to_the_next_daemon(node, image):
    """Stopping the daemon's container (an upgrade's restart) leaves a claimed child's VMM running (the daemon exits
    without killing it, host PID namespace, FORKD_VMM_DETACH); the next container's daemon adopts it: it answers."""
    name, store = node
    res = podrun.exec_(name, "forkd", "apply", "-f", "-", input=POOL)  # unchanged if the test before applied it
    assert res.returncode == 0, res.stderr
    backend = RemoteBackend(str(Layout(store).daemon_socket))
    wait_for("img-pool warm", lambda: (st := backend.get("ForkPool", "img-pool")[0].status) and st.warm >= 1,
             timeout=900)
    res = podrun.exec_(name, "forkd", "claim", "img-pool", "-o", "json")
    assert res.returncode == 0, res.stderr
    child = json.loads(res.stdout)["children"][0]["id"]
    pid = vmm_pid(child)
    assert pid is not None
    podrun.stop(name)
    assert vmm_pid(child) == pid, "the VMM died with its daemon's container"
    podrun.start_main(image, store, name)
    wait_for("the new daemon's socket", Layout(store).daemon_socket.exists, timeout=60)
    res = podrun.exec_(name, "forkd", "exec", child, "--", "echo", "adopted")
    assert res.returncode == 0 and "adopted" in res.stdout, res.stderr
    assert vmm_pid(child) == pid
