"""The VMM uid range is the VMMs' alone (SECURITY.md section 5): a range the host also hands out as subordinate ids
(/etc/subuid, /etc/subgid: user namespaces of containers) is refused before any VMM drops to it, naming the line;
the range is configurable. No VM: the refusal comes before a VMM starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.base import idrange
from forkd.base.errors import InvalidInput
from forkd.core.doctor import FAIL, PASS, check_vmm_uids
from forkd.sandbox.supervisor import runas_identity
from forkd.vmm.driver import Machine
from forkd.vmm.qemu_cmdline import build_identity

SUBUID = """# rootless podman and LXD-style ranges
alice:100000:65536
lxd:1000000:1000000000
bad line
bob:x:5
"""

TABLE = [  # (start, count) of the VMM range -> owners it clashes with
    ((1 << 28, 1 << 29), ["lxd"]),  # the default range inside LXD's billion ids
    ((2 << 30, 1 << 29), []),  # above every range
    ((165536, 1000), []),  # right after alice's
    ((165535, 1000), ["alice"]),  # one id into alice's
    ((99000, 1001), ["alice"]),  # ends on alice's first id
    ((99000, 1000), []),  # ends just before it
]


@pytest.mark.parametrize("rng,owners", TABLE)
def test_overlaps_are_found_at_both_ends(tmp_path, rng, owners):
    f = tmp_path / "subuid"
    f.write_text(SUBUID)
    assert [c.owner for c in idrange.clashes(*rng, (f,))] == owners





def test_an_overlapping_range_refuses_every_vmm_identity_naming_the_line(tmp_path, monkeypatch):
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text(SUBUID)
    subgid.write_text("carol:1500000000:10\n")
    monkeypatch.setattr(idrange, "SUBID_FILES", (subuid, subgid))
    with pytest.raises(InvalidInput, match=r"subuid line 3 \(lxd") as info:
        runas_identity("c0123456789")
    assert "FORKD_VMM_UID_BASE" in info.value.hint
    with pytest.raises(InvalidInput, match="subuid line 3"):
        build_identity(Machine(Path("k"), Path("i")))
    assert check_vmm_uids().status == FAIL
    monkeypatch.setenv("FORKD_VMM_UID_BASE", str(2 << 30))  # moved above every range: allowed
    n = int(runas_identity("c0123456789").split(":")[0])
    assert 2 << 30 <= n < (2 << 30) + (1 << 28)
    assert check_vmm_uids().status == PASS
    monkeypatch.setenv("FORKD_VMM_UID_BASE", str(1500000000 - 100))  # now the subgid range is hit
    monkeypatch.setenv("FORKD_VMM_UID_COUNT", "4096")
    with pytest.raises(InvalidInput, match="subgid line 1"):
        runas_identity("c0123456789")


def test_identities_stay_in_their_halves_of_a_configured_range(tmp_path, monkeypatch):
    monkeypatch.setattr(idrange, "SUBID_FILES", (tmp_path / "none",))
    monkeypatch.setenv("FORKD_VMM_UID_BASE", "3000000")
    monkeypatch.setenv("FORKD_VMM_UID_COUNT", "4096")
    kids = {int(runas_identity(f"c{i:010x}").split(":")[0]) for i in range(0, 1 << 24, 4099)}
    builds = {int(build_identity(Machine(Path("k"), Path("i"))).split(":")[0]) for _ in range(200)}
    assert all(3000000 <= u < 3002048 for u in kids) and len(kids) > 1000
    assert all(3002048 <= u < 3004096 for u in builds)
    monkeypatch.setenv("FORKD_VMM_UID_BASE", str((1 << 32) - 2048))
    with pytest.raises(InvalidInput, match="reaches uid"):
        runas_identity("c0123456789")
