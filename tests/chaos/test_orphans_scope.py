"""The crash harness judges only its own home's leftovers: gc's dry run also lists the network of homes that no
longer exist and the VMMs in it (host-wide garbage, e.g. a test elsewhere that deleted its home first), which is
not this home's violation. No VM: a real namespace and real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from forkd.sandbox import cgroups, netns
from tests.chaos.invariants import holds_beneath, others_network, this_homes

MINE, OTHER = "forkd-hmine-c1", "forkd-hother-c2"


@pytest.mark.parametrize(("found", "others", "holding", "kept"), [
    ({"netns": [MINE, OTHER]}, {OTHER}, {}, {"netns": [MINE]}),
    ({"netns": [OTHER], "veths": ["fkv-c2"], "leases": ["10.1.0.2"]}, {OTHER, "fkv-c2", "10.1.0.2"}, {}, {}),
    ({"processes": [11, 12, 13]}, set(), {11: True, 12: False, 13: None}, {"processes": [11]}),
    ({"dirs": ["c9"], "cgroups": ["c9"]}, {"c9"}, {}, {"dirs": ["c9"], "cgroups": ["c9"]}),  # files: this home's
    ({"reaped": ["c3"], "netns": []}, set(), {}, {"reaped": ["c3"]}),
])
def test_only_this_homes_leftovers_are_violations(found, others, holding, kept):
    assert this_homes(found, others, holding.get) == kept


def test_a_process_holding_a_file_beneath_the_home_is_its(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for d in (home, elsewhere):
        (d / "children" / "c1").mkdir(parents=True)
    code = "import sys, time; f = open(sys.argv[1], 'w'); print('ready', flush=True); sys.stdin.read()"
    p = subprocess.Popen([sys.executable, "-c", code, str(home / "children" / "c1" / "qemu.log")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        assert holds_beneath(p.pid, home) is True
        assert holds_beneath(p.pid, elsewhere) is False
    finally:
        p.stdin.close()
        p.wait()
    assert holds_beneath(p.pid, home) is None  # gone (reaped): nothing of it is left


@pytest.mark.skipif(os.geteuid() != 0, reason="making a network namespace needs root")
def test_another_homes_namespace_is_named_by_its_key(tmp_path):
    home, other = tmp_path / "a", tmp_path / "b"
    name = netns.netns_name("cscope1", str(other))
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name.startswith(f"{netns.NETNS_PREFIX}{cgroups.home_key(str(other))}-")
        assert name in others_network(home)
        assert name not in others_network(other)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
