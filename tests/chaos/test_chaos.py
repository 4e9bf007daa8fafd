"""The crash harness in its reduced form (CI): a daemon under mixed load on a private home, kill -9'd with some of
its CLI processes at seeded random points, KILLS times; after every restart each invariant of
tests/chaos/invariants.py must hold. One run serves every test below (one test per invariant, so a known bug
marks only its own invariant). The full form: `python -m tests.chaos --kills 50 --seed 7`."""

from __future__ import annotations

import pytest

from tests.chaos.harness import Chaos, Config, Report

pytestmark = pytest.mark.vm

SEED = 7
KILLS = 3


@pytest.fixture(scope="module")
def chaos(rt) -> Report:
    rt.build_image()  # the session's image (cached): the private home copies it instead of building one
    run = Chaos(Config(kills=KILLS, seed=SEED, max_load=6.0, image_from=rt.layout.home))
    try:
        run.run()
    finally:
        run.close()
    print(run.report.summary())
    return run.report


def _holds(report: Report, category: str) -> None:
    violations = report.violations(category)
    assert not violations, f"{len(violations)} violations of '{category}':\n" + "\n".join(violations) + \
        "\n\n" + report.summary()


def test_chaos_really_killed_and_restarted(chaos):
    assert len(chaos.kills()) == KILLS
    assert all(r.daemon_up_s is not None for r in chaos.kills())
    assert sum(n for (op, k), n in chaos.outcomes.items() if k == "ok") > 0, chaos.summary()


def test_chaos_snapshots_ready_and_verified_or_failed(chaos):
    _holds(chaos, "snapshots")


def test_chaos_children_answer_or_are_reaped(chaos):
    _holds(chaos, "children")


def test_chaos_leaves_no_orphans(chaos):
    _holds(chaos, "orphans")


def test_chaos_pools_back_at_target(chaos):
    _holds(chaos, "pools")
    assert all(r.recover_s is not None for r in chaos.kills()), chaos.summary()


def test_chaos_audit_log_verifies(chaos):
    _holds(chaos, "audit")


def test_chaos_home_destroyed_without_leaked_vmm(chaos):
    assert not chaos.leaked_qemu, chaos.summary()


def test_chaos_no_internal_errors_while_the_daemon_is_up(chaos):
    _holds(chaos, "errors")
