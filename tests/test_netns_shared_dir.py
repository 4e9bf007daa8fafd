"""An `ip netns add` run on the host while forkd has namespaces must not make them unremovable.

iproute2 bind-mounts /run/netns over itself the first time it finds it a plain directory; a namespace forkd had
mounted there before is hidden by that bind, and its teardown (umount and unlink by path) then leaks it. Each
case runs in a mount namespace of its own (`unshare --mount`) with a fresh tmpfs on /run, so /run/netns starts as
the plain directory a freshly booted host has and nothing of the host's mounts is touched. Needs root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
                                reason="needs root, unshare(1) and ip(8)")

SCRIPT = """
import json, os, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "forkd-test-run", "/run"], check=True)
os.makedirs("/run/netns")
from forkd.sandbox import netns
net = netns.create_empty("c0123456789", sys.argv[1])
subprocess.run(["ip", "netns", "add", "fktest-admin"], check=True)  # what a host's admin may run meanwhile
opens = subprocess.run(["ip", "netns", "exec", net.netns, "true"]).returncode
netns.teardown(net)
mounts = open("/proc/self/mountinfo").read().splitlines()  # hidden mounts too
print(json.dumps({"left": [m.split()[4] for m in mounts if net.netns in m],
                  "file": os.path.lexists(netns.NETNS_DIR / net.netns), "entered": opens == 0}))
"""


def test_a_namespace_made_before_an_ip_netns_add_is_still_entered_and_removed(tmp_path):
    env = dict(os.environ, FORKD_RUN_DIR=str(tmp_path / "run"))
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", SCRIPT,
                          str(tmp_path / "home")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["entered"], "the namespace's path no longer reaches it after `ip netns add`"
    assert out == {"left": [], "file": False, "entered": True}, (out, res.stderr)
