"""Markers say what a test boots, and the session keeps them honest (hooks registered in conftest.py).

Declared in pyproject.toml ([tool.pytest.ini_options] markers):

    vm     boots real QEMU guests (TCG here): the VM tier
    image  builds a guest image or rootfs (mmdebstrap, initramfs, OCI unpack) but boots no VM
    bench  runs a benchmark script end to end in its short mode (the last tier; most also boot VMs)
    long   takes minutes even when everything is right: left out of the default run, `scripts/test.sh --long`

Users of the image-building fixtures (`IMAGE_FIXTURES`) get `image` at collection. Two checks, both failing the
run rather than warning:
- at collection, a test whose fixtures (transitively) include one that boots a VM (`VM_FIXTURES`, unless its
  module overrides it with the fake driver's) must be marked `vm`;
- while it runs, a test not marked `vm` that starts QEMU in this process (a VMM or the accelerator's boot probe,
  in a fixture or in the test itself) errors at teardown, naming the marker to add.
A VM booted by a subprocess the test starts (a daemon, the CLI, a benchmark script) is not seen by the second check:
such tests are marked by hand. The reverse (marked `vm`, booted nothing here) is listed at the end of the run, since
a subprocess may have booted what this process did not see (that list is printed by a run without pytest-xdist
workers: a worker's summary is not shown).

Users of the swap fixture (`SHARED_SWAP`) get `serial` at collection: scripts/test.sh runs `serial` tests alone,
after a tier's pytest-xdist workers (`--dist loadfile`: a worker runs a module whole) are done.
"""

from __future__ import annotations

import functools
import inspect

import pytest

from tests.schedule import module_order

# fixtures that boot a VM when set up, by the module that defines them (conftest's `fork` and branching's `sfork`
# are built on these); a module that overrides one with the fake driver's (tests/fake_vmm.py) boots nothing
VM_FIXTURES = {"base": "tests/conftest.py", "srt": "tests/branching.py"}
# fixtures that build a rootfs from the default image's packages (tests.oci_images): their users get `image`
IMAGE_FIXTURES = frozenset({"layers", "layout_dir"})
# fixtures of a host-wide resource one module sets up and tears down (tests.swap): their users get `serial`, so
# one module's zram device is never swapped off under another worker's paged-out children
SHARED_SWAP = frozenset({"swap"})
_BOOTS = [0]
_BEFORE = pytest.StashKey[int]()
_QUIET_VM = pytest.StashKey[list]()
_PASSED: set[str] = set()


def _counted(fn):
    @functools.wraps(fn)
    def boot(*args, **kwargs):
        _BOOTS[0] += 1
        return fn(*args, **kwargs)
    return boot


def pytest_configure(config: pytest.Config) -> None:
    from forkd.vmm import accel
    from forkd.vmm.qemu import QemuDriver

    QemuDriver._start = _counted(QemuDriver._start)
    accel.probe = _counted(accel.probe)  # QemuDriver.probe_accel looks it up at each call
    config.stash[_QUIET_VM] = []


def _order_modules(items: list[pytest.Item]) -> None:
    """Modules in tests/schedule.py's order (long ones first, benchmark smoke last); each module's tests keep theirs."""
    counts: dict[str, int] = {}
    bench: dict[str, bool] = {}
    for it in items:
        path = it.nodeid.split("::", 1)[0]
        counts[path] = counts.get(path, 0) + 1
        bench[path] = bench.get(path, False) or it.get_closest_marker("bench") is not None
    rank = {p: i for i, p in enumerate(module_order([(p, n, bench[p]) for p, n in counts.items()]))}
    items.sort(key=lambda it: rank[it.nodeid.split("::", 1)[0]])


def _vm_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures of `item` (transitively) that boot a VM: those of VM_FIXTURES its module did not override."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(name for name, where in VM_FIXTURES.items() if name in info.name2fixturedefs
                  and inspect.unwrap(info.name2fixturedefs[name][-1].func).__code__.co_filename.endswith("/" + where))


@pytest.hookimpl(tryfirst=True)  # before the -m selection, which reads the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _order_modules(items)
    for it in items:
        if IMAGE_FIXTURES & set(getattr(it, "fixturenames", ())):
            it.add_marker(pytest.mark.image)
        if SHARED_SWAP & set(getattr(it, "fixturenames", ())):
            it.add_marker(pytest.mark.serial)
    wrong = [f"{it.nodeid} (uses {', '.join(_vm_fixtures(it))})"
             for it in items if _vm_fixtures(it) and not it.get_closest_marker("vm")]
    if wrong:
        raise pytest.UsageError("these tests use a fixture that boots a VM but are not marked vm; add "
                                "@pytest.mark.vm:\n  " + "\n  ".join(wrong))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_BEFORE] = _BOOTS[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    booted = _BOOTS[0] - item.stash.get(_BEFORE, _BOOTS[0])
    is_vm = item.get_closest_marker("vm") is not None
    if booted and not is_vm:
        raise pytest.fail.Exception(f"{item.nodeid} started QEMU {booted} time(s) but is not marked vm: add "
                                    "@pytest.mark.vm (tests/markers.py)", pytrace=False)
    if is_vm and not booted and item.nodeid in _PASSED and not _vm_fixtures(item):
        item.config.stash[_QUIET_VM].append(item.nodeid)
    return result


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _PASSED.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    quiet = config.stash.get(_QUIET_VM, [])
    if quiet:
        terminalreporter.write_sep("-", f"{len(quiet)} vm-marked tests started no QEMU in this process "
                                        "(a subprocess may have; else drop their vm marker)")
        for nodeid in quiet:
            terminalreporter.write_line(f"  {nodeid}")
