"""Run the containers of deploy/kubernetes/daemonset.yaml's pod with podman, as a kubelet would run them (a stand-in:
no Kubernetes here). The commands, environment, privileges, hostPID and volumes come from the manifest; the store's
hostPath (/var/lib/forkd) becomes the test's own directory, an emptyDir of medium Memory a tmpfs. Host network
always (podman's own networks need CNI set-up this machine lacks); runc, since crun refuses hybrid cgroup hosts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DAEMONSET = ROOT / "deploy" / "kubernetes" / "daemonset.yaml"
STORE = "/var/lib/forkd"
SHM_SIZE = "2g"


def podman() -> list[str]:
    return ["podman", "--runtime", shutil.which("runc") or "runc"]


def pod_spec() -> dict:
    return yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]


def run_argv(container: dict, image: str, store: Path, name: str, detach: bool) -> list[str]:
    """`podman run` of one of the pod's containers."""
    pod = pod_spec()
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    argv = [*podman(), "run", "--name", name, "--network", "host",
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]  # podman's defaults exceed this host's
    if pod.get("hostPID"):
        argv += ["--pid", "host"]
    if (container.get("securityContext") or {}).get("privileged"):
        argv.append("--privileged")
    for env in container.get("env") or []:
        argv += ["-e", f"{env['name']}={env['value']}"]
    for mount in container.get("volumeMounts") or []:
        vol = volumes[mount["name"]]
        if "hostPath" in vol:
            src = store if vol["hostPath"]["path"] == STORE else Path(vol["hostPath"]["path"])
            argv += ["-v", f"{src}:{mount['mountPath']}"]
        elif (vol.get("emptyDir") or {}).get("medium") == "Memory":
            argv += ["--mount", f"type=tmpfs,destination={mount['mountPath']},tmpfs-size={SHM_SIZE}"]
        else:
            raise AssertionError(f"volume {mount['name']}: no podman equivalent in this harness")
    argv += ["-d"] if detach else ["--rm"]
    return [*argv, image, *container["command"]]


def run_init(image: str, store: Path, prefix: str) -> None:
    """The pod's init containers, in order, each to completion (exit 0), as the kubelet runs them."""
    for c in pod_spec().get("initContainers") or []:
        res = subprocess.run(run_argv(c, image, store, f"{prefix}-{c['name']}", detach=False), capture_output=True,
                             text=True, timeout=1200)
        assert res.returncode == 0, f"init container {c['name']}: {res.stderr[-3000:]}"


def start_main(image: str, store: Path, name: str) -> None:
    [c] = pod_spec()["containers"]
    res = subprocess.run(run_argv(c, image, store, name, detach=True), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]


def stop(name: str, grace: int = 30) -> None:
    subprocess.run([*podman(), "stop", "-t", str(grace), name], capture_output=True, timeout=grace + 60)
    subprocess.run([*podman(), "rm", "-f", name], capture_output=True, timeout=60)


def exec_(name: str, *argv: str, input: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*podman(), "exec", "-i", name, *argv], capture_output=True, text=True, input=input,
                          timeout=timeout)
