"""The order pytest-xdist's workers take test modules in (`--dist loadfile --no-loadscope-reorder`: a worker takes
the next whole module in collection order as it runs out of work).

Longest first: a long module that starts last runs alone on one worker while the others wait with nothing left to
take, so the modules known to take long are collected first, in `LONG_FIRST`'s order; the others follow by their
number of tests, most first (what pytest-xdist's own reordering does), and the benchmark smoke modules come last
(scripts/test.sh: they run after the tier's other tests, as its workers run out of those). A module missing from
`LONG_FIRST`, or one listed that has become quick, changes only how long a run takes, never what it runs.
"""

from __future__ import annotations

from collections.abc import Sequence

# modules that take long, longest first (from the per-module times of a CI run: bench/reports/*-ci-tiers.md)
LONG_FIRST = (
    # tests that boot VMs
    "tests/test_branch.py",
    "tests/test_inspect_provider.py",
    "tests/test_pack.py",
    "tests/chaos/test_chaos.py",
    "tests/test_ports_relay.py",
    "tests/test_disk_rootfs.py",
    "tests/security/test_egress_per_sandbox.py",
    "tests/test_upgrade.py",
    "tests/test_images.py",
    "tests/test_chain.py",
    "tests/test_failures.py",
    "tests/test_ports.py",
    # tests that boot none
    "tests/test_boot_failures.py",
    "tests/test_schemathesis.py",
    "tests/k8s/test_operator_nodes.py",
    "tests/k8s/test_operator_api.py",
    "tests/security/test_daemon_api.py",
    "tests/k8s/test_operator_distribute.py",
    "tests/test_registry.py",
    "tests/test_pack_crash.py",
    "tests/test_lifetimes.py",
    "tests/test_namespaces.py",
    "tests/security/test_image_author.py",
    "tests/test_operator.py",
)


def module_order(modules: Sequence[tuple[str, int, bool]], long_first: Sequence[str] = LONG_FIRST) -> list[str]:
    """`modules`: (path, number of tests, is benchmark smoke) per module; their paths in the order to run them."""
    rank = {path: i for i, path in enumerate(long_first)}

    def key(m: tuple[str, int, bool]) -> tuple:
        path, count, bench = m
        return (bench, path not in rank, rank.get(path, 0), -count, path)

    return [m[0] for m in sorted(modules, key=key)]
