"""A spawn that fails after its VMM started leaves no child `starting` behind, whatever else fails with it.

Found by a soak's full-home fault: the child's record could not be written `running` (ENOSPC) after its VMM
answered; that write was outside the spawn's clean-up, and the clean-up's own write (`failed`) needed the same
space. The record stayed `starting`, owned by the live daemon, its VMM running: nobody may stop, reap or retire a
child its live spawner owns, and its pool counted it as on its way, so the pool stayed one short (`Scaling`) until
the daemon died. Now the spawn's clean-up covers that write, and a record that cannot say `failed` is removed.

The fake driver stands in for QEMU (its processes are real; tests/test_driver_contract.py); the full disk is
injected where the registry writes a record (every other write goes through)."""

from __future__ import annotations

import errno

import pytest

from forkd.base.errors import ForkdError
from forkd.base.procs import is_alive
from forkd.core.requests import Spawn
from forkd.sandbox.registry import Registry
from tests.conftest import BASE_TAG


@pytest.fixture
def full_for(monkeypatch):
    """Make the registry's writes of records in the given states fail as on a full disk; yields the pids of the
    VMMs the spawns recorded."""
    real = Registry.save
    pids: list[int] = []

    def setup(*states: str) -> list[int]:
        def save(self, rec):
            if rec.state in states:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            if rec.pid:
                pids.append(rec.pid)
            return real(self, rec)

        monkeypatch.setattr(Registry, "save", save)
        return pids

    return setup


@pytest.mark.parametrize("full", [("running",), ("running", "failed")], ids=["running", "running-and-failed"])
def test_a_spawn_whose_record_cannot_say_running_leaves_no_starting_child(fake_rt, fake_base, full_for, full,
                                                                         monkeypatch):
    pids = full_for(*full)
    with pytest.raises(ForkdError, match="No space left"):
        fake_rt.fork(Spawn.of(tag=BASE_TAG, n=1, pool="abandon"))
    monkeypatch.undo()
    left = [r for r in fake_rt.registry.list() if r.pool == "abandon"]
    assert not [r for r in left if r.status == "starting"], left  # nothing its live spawner will never finish
    assert pids and not [p for p in pids if is_alive(p, None)], "the abandoned child's VMM still runs"
    assert not left  # the fork removed its failed child (the first case); the second had no record to keep
