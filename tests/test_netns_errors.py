"""Netlink failures are errors, never "nothing there": gc and doctor must not report no leftovers because the
listing failed, nor a veth as gone because its deletion was refused. The failures are real: a process out of file
descriptors (no netlink socket) and an unprivileged uid deleting a link, in a network namespace the test makes."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

NO_FDS = """
import os, resource
from forkd.base.errors import ForkdError
from forkd.sandbox import netns
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    print("LISTED", netns.host_links())
except ForkdError as exc:
    print("ERROR", exc.message)
"""

DELETE = """
from forkd.base.errors import ForkdError
from forkd.sandbox import netns
try:
    print("DELETED", netns.delete_link("{name}"), netns.delete_link("fkhnosuchlink"))
except ForkdError as exc:
    print("ERROR", exc.message)
"""


def _run(code: str, *prefix: str) -> str:
    r = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_listing_that_fails_is_an_error_not_an_empty_list():
    out = _run("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n" + NO_FDS)
    assert out.startswith("ERROR cannot list the host's network interfaces"), out


@pytest.fixture
def scratch_netns():
    name = "fkt" + uuid.uuid4().hex[:8]
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_refused_deletion_is_an_error_and_a_missing_link_is_false(scratch_netns):
    link = "fkhtest0"
    subprocess.run(["ip", "-n", scratch_netns, "link", "add", link, "type", "veth", "peer", "name", "fkhtest1"],
                   check=True)
    out = _run(DELETE.format(name=link), "ip", "netns", "exec", scratch_netns, "setpriv", "--reuid=65534",
               "--regid=65534", "--clear-groups")
    assert out.startswith(f"ERROR cannot delete host interface {link}"), out
    assert link in subprocess.run(["ip", "-n", scratch_netns, "link"], capture_output=True, text=True).stdout
    out = _run(DELETE.format(name=link), "ip", "netns", "exec", scratch_netns)  # as root: deleted, then absent
    assert out == "DELETED True False", out
