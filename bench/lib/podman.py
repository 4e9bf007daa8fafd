"""Containers of the forkd guest's own rootfs, for the side-by-side benchmarks: the image is the default guest
image's initramfs (busybox, Python 3.11 and its stdlib: the same files a forkd child runs) with the staged
workload added, imported into podman; containers run under runc (crun refuses this host's hybrid cgroups) with no
network. Every container is started and removed by id; nothing is looked up by name."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

RUNTIME = "/usr/sbin/runc"
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]  # podman's defaults exceed this host's


def available() -> str | None:
    """None when podman and runc are here; else why not."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc)"
    if not Path(RUNTIME).exists():
        return f"{RUNTIME} is not installed (apt-get install runc)"
    return None


def run_argv(image: str, cgroup_parent: str | None, *extra: str) -> list[str]:
    """`podman run` with this host's settings; `extra` are more run options, then the image and command follow."""
    cg = ["--cgroup-parent", cgroup_parent] if cgroup_parent else []
    return ["podman", "--runtime", RUNTIME, "run", *ULIMITS, "--network", "none", *cg, *extra, image]


def image_from_initrd(initrd: Path, staged: Path, root_in_image: str, tag: str) -> str:
    """`localhost/forkd-bench:TAG`: the initramfs unpacked, `staged` copied to `root_in_image`, imported (reused
    when it exists: the tag is the caller's content hash)."""
    name = f"localhost/forkd-bench:{tag}"
    if subprocess.run(["podman", "image", "exists", name]).returncode == 0:
        return name
    with tempfile.TemporaryDirectory(prefix="forkd-bench-rootfs-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        with initrd.open("rb") as f:
            res = subprocess.run(["cpio", "-idm", "--quiet", "--no-absolute-filenames"], stdin=f, cwd=root,
                                 capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"cannot unpack {initrd} (cpio): {res.stderr[-800:]}")
        shutil.copytree(staged, root / root_in_image.lstrip("/"), dirs_exist_ok=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        res = subprocess.run(["podman", "import", "-q", "-", name], stdin=tar.stdout, capture_output=True,
                             text=True)
        tar.stdout.close()
        tar.wait()
        if res.returncode != 0 or tar.returncode != 0:
            raise RuntimeError(f"podman import of the guest rootfs failed: {res.stderr[-800:]}")
    return name
