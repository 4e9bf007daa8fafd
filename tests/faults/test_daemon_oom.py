"""The daemon under memory pressure and OOM-killed by the kernel: its children live on and the restarted daemon
adopts them, as after kill -9.

A real daemon (`forkd serve`, tests/chaos/rig.py) on a private home fills a pool and hands out one child; then
the daemon's process is moved into a memory cgroup of its own with a limit far below what it needs, and the test
drives requests at it until the kernel's OOM killer ends it (the group's `oom_kill` count says it was the kernel,
not the test). The VMMs are not in that group: each child's VMM sits in its own group (forkd.sandbox.cgroups),
which the test checks first, so the OOM killer has only the daemon to choose. Then a daemon is started again and
must find every child where it was: the claimed one still claimed and answering, the idle one still in its pool
(adopted, not replaced), nothing orphaned.

This host has cgroup v1 controllers (its v2 hierarchy has none): the group is a v1 memory group under the test's
own, with `memory.limit_in_bytes`, and the kill is counted in `memory.oom_control`; on a v2 host the same steps
use `memory.max` and `memory.events`. Needs root (cgroups). Boots a parent: minutes under TCG (faults "long")."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from tests.chaos import invariants as inv
from tests.chaos.rig import Rig

pytestmark = [pytest.mark.vm, pytest.mark.faults("long"), pytest.mark.serial,  # Rig: gc --grace 0
              pytest.mark.skipif(os.geteuid() != 0, reason="making a memory cgroup needs root")]

SPEC = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: oom-p}
spec: {memoryMiB: 256, warmup: {imports: [json]}}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: oom-a}
spec: {from: oom-p, warm: 1, maxChildren: 2}
"""
LIMIT = 4 << 20  # bytes: far below a Python daemon's working set, so its next allocations overflow it


def memory_group() -> Path | None:
    """A memory cgroup to make one in: beneath this process's own (v1, or v2 with the memory controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else []:
        own = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::"))
        return v2 / own.split("::", 1)[1].lstrip("/")
    return None


def oom_kills(group: Path) -> int:
    """The kernel's count of OOM kills in `group` (v1 memory.oom_control, v2 memory.events)."""
    for name in ("memory.oom_control", "memory.events"):
        with contextlib.suppress(FileNotFoundError):
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    raise AssertionError(f"no oom_kill count in {group}")


@contextlib.contextmanager
def limited_group(name: str):
    base = memory_group()
    if base is None or not base.is_dir():
        pytest.skip("no memory cgroup controller to limit the daemon with")
    group = base / name
    group.mkdir()
    try:
        limit_file = "memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists() else "memory.max"
        yield group, limit_file
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # the killed daemon's last pages are still being uncharged


def memory_cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") or controllers == "":
            return path
    return ""


def post(rig: Rig, path: str, body: bytes, timeout: float = 30.0) -> int:
    """POST a JSON `body` to the daemon's unix socket; the status (the daemon reads and parses the whole body)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(rig.home / "forkd.sock"))
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        return int(sock.recv(64).split(b" ", 2)[1])
    finally:
        sock.close()


def pressure(rig: Rig, stop: threading.Event) -> None:
    """Requests at the daemon until it dies: claims with a large body that fails validation once parsed (nothing
    is claimed), so each one makes the daemon hold the body and its parsed objects at once."""
    body = json.dumps({"n": "not a number", "pad": ["x" * 16] * (1 << 18)}).encode()  # 5 MiB, ~30 MiB parsed
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError, IndexError):
            post(rig, "/v1/pools/oom-a/claim", body)
            rig.http_get("/v1/children", timeout=5.0)


@pytest.fixture
def image_home(request) -> Path:
    """A home with the guest image to copy: the host's (FORKD_IMAGE_FROM, default /var/lib/forkd) when it has one,
    else the test session's, built on first use."""
    host = Path(os.environ.get("FORKD_IMAGE_FROM", "/var/lib/forkd"))
    if (host / "images" / "default").is_file():
        return host
    rt = request.getfixturevalue("rt")
    rt.build_image()
    return rt.layout.home


def test_a_daemon_oom_killed_by_the_kernel_leaves_its_children_to_the_next_one(image_home):
    rig = Rig.create(image_from=image_home)
    try:
        rig.start_daemon()
        assert rig.apply(SPEC).returncode == 0
        deadline = time.monotonic() + 900
        while inv.check_pools(rig.pools()):
            assert time.monotonic() < deadline, f"the pool never filled: {rig.daemon_log_tail()}"
            time.sleep(0.5)
        claimed = rig.json("claim", "oom-a")["children"][0]["id"]
        home_rt = Runtime(Layout(rig.home))
        while inv.check_pools(rig.pools()):  # refilled behind the claim
            assert time.monotonic() < deadline, f"the pool never refilled: {rig.daemon_log_tail()}"
            time.sleep(0.5)
        before = {r.id: r.pid for r in home_rt.registry.list()}
        idle = next(cid for cid in before if cid != claimed)
        with limited_group(f"fk-oom-{os.getpid()}") as (group, limit_file):
            (group / limit_file).write_text(str(LIMIT))
            (group / "cgroup.procs").write_text(str(rig.daemon.pid))
            assert memory_cgroup_of(rig.daemon.pid).endswith(f"/{group.name}")
            for cid, pid in before.items():  # the OOM killer's choice is the daemon's group only: VMMs are not in it
                assert memory_cgroup_of(pid) != memory_cgroup_of(rig.daemon.pid), (cid, memory_cgroup_of(pid))
            stop = threading.Event()
            drivers = [threading.Thread(target=pressure, args=(rig, stop), daemon=True) for _ in range(4)]
            for t in drivers:
                t.start()
            try:
                rig.daemon.wait(timeout=300)
            finally:
                stop.set()
                rig.kill_daemon()  # not killed by the kernel (the test fails): out of the group before it goes
            assert rig.daemon.returncode == -9, rig.daemon_log_tail()
            assert oom_kills(group) >= 1  # the kernel killed it, not this test
        rig.start_daemon()
        while inv.check_pools(rig.pools()):
            assert time.monotonic() < deadline + 300, f"the pool never recovered: {rig.daemon_log_tail()}"
            time.sleep(0.5)
        after = {r.id: r for r in home_rt.registry.list()}
        assert after[claimed].claimed and after[claimed].pid == before[claimed]
        assert after[idle].pid == before[idle] and not after[idle].claimed  # adopted, not replaced
        assert set(after) == set(before), (before, after)
        assert inv.check_children(home_rt, {claimed}) == []
        assert inv.check_orphans(home_rt, set(before)) == []
        res = rig.cli("exec", claimed, "--", "echo", "alive")
        assert res.returncode == 0 and res.stdout.strip() == "alive", res.stderr
    finally:
        rig.destroy()
