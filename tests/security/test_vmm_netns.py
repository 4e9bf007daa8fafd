"""Every child VMM has a network namespace of its own (the jailer's network isolation, SECURITY.md section 5): a
VMM without a NIC gets an empty one, so a compromised QEMU reaches no host loopback service, no host abstract unix
socket and no other VMM. The attack runs for real: a process joins the VMM's namespace with the VMM's own uid and
tries the host's loopback listener and abstract socket the test opened. Real VMs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

import pytest

from forkd.sandbox import netns
from tests.security.test_vmm_privileges import proc_status

pytestmark = pytest.mark.vm

REACH = """
import socket, sys
port, abstract = int(sys.argv[1]), sys.argv[2]
out = []
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    out.append("tcp-reached")
except OSError as exc:
    out.append(f"tcp-refused:{exc.errno}")
u = socket.socket(socket.AF_UNIX)
try:
    u.connect("\\0" + abstract)
    out.append("abstract-reached")
except OSError as exc:
    out.append(f"abstract-refused:{exc.errno}")
print(" ".join(out))
"""


def _try_from(pid: int, port: int, abstract: str) -> str:
    """Join VMM `pid`'s network namespace as its uid:gid and try the host's listeners."""
    uid = proc_status(pid)["Uid"].split()[0]
    r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "setpriv", f"--reuid={uid}", f"--regid={uid}",
                        "--clear-groups", sys.executable, "-c", REACH, str(port), abstract],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_vmm_without_a_nic_reaches_no_host_loopback_service_nor_a_sibling(rt, fork):
    a, b = fork(2)
    host_ns = os.stat("/proc/self/ns/net").st_ino
    inodes = {c.id: os.stat(f"/proc/{c.pid}/ns/net").st_ino for c in (a, b)}
    assert host_ns not in inodes.values() and len(set(inodes.values())) == 2  # its own, each
    assert a.netns == netns.netns_name(a.id, str(rt.layout.home)) and netns.exists(a.netns)
    links = subprocess.run(["ip", "-n", a.netns, "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]
    listener = socket.create_server(("127.0.0.1", 0))
    abstract = f"forkd-test-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract)
    unix.listen()
    try:
        port = listener.getsockname()[1]
        here = subprocess.run([sys.executable, "-c", REACH, str(port), abstract], capture_output=True, text=True,
                              timeout=60).stdout.strip()
        assert here == "tcp-reached abstract-reached"  # the attack works from the host's namespace
        out = _try_from(a.pid, port, abstract)
        assert "tcp-reached" not in out and "abstract-reached" not in out, out
    finally:
        listener.close()
        unix.close()
    rt.kill([a.id])
    assert not netns.exists(a.netns)  # it goes with its child


def test_another_home_s_gc_leaves_a_child_s_empty_namespace_alone(rt, fork, tmp_path):
    """Namespaces are host-wide: an empty one is leased under its own name, naming its home, before it exists, so
    the gc of another home on this host (even with no grace) neither counts it nor kills its VMM; its own home's
    gc takes both once the child is gone."""
    from forkd.base.paths import Layout
    from forkd.core.runtime import Runtime

    (c,) = fork(1)
    lease = netns.leases_dir() / c.netns
    assert lease.exists()
    other = Runtime(Layout(tmp_path / "other-home")).gc(dry_run=True, grace=0.0)
    assert c.netns not in other["netns"] and c.pid not in other["processes"], other
    rt.kill([c.id])
    assert not lease.exists() and not netns.exists(c.netns)
