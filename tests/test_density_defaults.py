"""What a fresh install gets for idle children: the zram swap scripts/setup.sh makes (scripts/zram.sh, for real on
this host: root and the zram module, else skipped), `forkd doctor`'s idle-pageout check (its decision, table-tested
from what it read), and the defaults that pay on it (sleep and prime on, each with an opt-out). No VM boots here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from forkd.base.errors import InvalidInput
from forkd.base.settings import settings
from forkd.core.doctor import check_idle_pageout
from forkd.core.idle import ZRAM_FIX, pageout_check
from forkd.vmm.pageout import not_in_ram, swap_devices

ROOT = Path(__file__).resolve().parent.parent
ZRAM, SETUP = ROOT / "scripts" / "zram.sh", ROOT / "scripts" / "setup.sh"
GIB = 1 << 20  # in KiB
SMALL = str(64 << 20)  # bytes: a zram device the tests make is this small


# -- the defaults ---------------------------------------------------------------------------------------------
def test_sleep_and_prime_are_on_by_default_and_each_opts_out(monkeypatch):
    monkeypatch.delenv("FORKD_IDLE_SLEEP", raising=False)
    monkeypatch.delenv("FORKD_PRIME", raising=False)
    assert (settings().idle_sleep, settings().prime, settings().idle_pageout_secs) == (True, True, 60)
    monkeypatch.setenv("FORKD_IDLE_SLEEP", "0")
    monkeypatch.setenv("FORKD_PRIME", "0")
    assert (settings().idle_sleep, settings().prime) == (False, False)
    monkeypatch.setenv("FORKD_PRIME", "sometimes")
    with pytest.raises(InvalidInput) as exc:
        settings()
    assert "FORKD_PRIME='sometimes'" in exc.value.message


def test_tests_that_need_unprimed_or_awake_children_get_them(unprimed, awake, settings_env):
    """The conftest fixtures a test names when it counts on the old defaults turn exactly those off; a setting
    that does not exist is refused, not set under a wrong name."""
    assert (settings().prime, settings().idle_sleep) == (False, False)
    with pytest.raises(AssertionError, match="no setting 'primed'"):
        settings_env(primed=False)


CI_RUN = ROOT / ".ci" / "run"


def test_ci_sets_up_without_a_zram_swap():
    """CI leaves its host's swap as it found it: its set-up passes --no-zram (tests that need swap make their own)."""
    setup = [line for line in CI_RUN.read_text().splitlines() if "scripts/setup.sh" in line and not
             line.lstrip().startswith("#")]
    assert setup and all("--no-zram" in line for line in setup), setup


# -- doctor's idle-pageout check --------------------------------------------------------------------------------
@pytest.mark.parametrize("secs, devices, on_disk, disk_ok, swap_kib, status, says", [
    (60, [], [], False, 0, "WARN", "the host has no swap"),
    (0, [], [], False, 0, "PASS", "idle page-out is off"),
    (60, ["/dev/sda2"], ["/dev/sda2"], False, 48 * GIB, "WARN", "/dev/sda2 is not zram"),
    (60, ["/dev/sda2"], ["/dev/sda2"], True, 48 * GIB, "PASS", "paged out after 60 s and put to sleep to /dev/sda2"),
    (60, ["/dev/zram0"], [], False, 1 * GIB, "WARN", "under half of this host's 24.0 GiB"),
    (60, ["/dev/zram0"], [], False, 12 * GIB, "PASS", "to /dev/zram0, 12.0 GiB"),
    (30, ["/dev/zram0"], [], False, 48 * GIB, "PASS", "paged out after 30 s and put to sleep"),
])
def test_doctor_says_whether_the_swap_the_defaults_assume_is_there(secs, devices, on_disk, disk_ok, swap_kib,
                                                                   status, says):
    got, detail, fix = pageout_check(secs, True, devices, on_disk, disk_ok, swap_kib, 24 * GIB)
    assert (got, says in detail) == (status, True), detail
    assert (fix is None) == (status == "PASS"), fix
    if status == "WARN" and not devices:
        assert fix == ZRAM_FIX and "scripts/setup.sh" in fix


def test_the_check_reads_this_host():
    got = check_idle_pageout()
    assert got.name == "idle-pageout" and got.status in ("PASS", "WARN"), got
    assert ("no swap" in got.detail) == (not swap_devices()), got


# -- scripts/zram.sh and setup.sh, for real ---------------------------------------------------------------------
def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _swaps() -> list[str]:
    return swap_devices()


@pytest.fixture
def bare_host(tmp_path):
    """A host with no swap at all, where root may add zram devices; the script's record goes under tmp_path."""
    if os.geteuid() != 0:
        pytest.skip("needs root (zram.sh adds a swap device)")
    if _swaps():
        pytest.skip(f"the host has swap already ({', '.join(_swaps())}): zram.sh would (rightly) do nothing")
    if not Path("/sys/class/zram-control/hot_add").exists():
        pytest.skip("no zram module on this host")
    env = {"FORKD_RUN_DIR": str(tmp_path / "run")}
    yield env
    _run(ZRAM, "down", env=env)
    for dev in _swaps():  # a test that failed half-way: the test-sized zram swaps it left (never the 1 GiB of swap.py)
        sysfs = Path("/sys/block") / Path(dev).name
        if dev.startswith("/dev/zram") and (sysfs / "disksize").read_text().strip() == SMALL:
            _run("swapoff", dev)
            _run("zramctl", "--reset", dev)


def test_up_makes_one_zram_swap_once_and_down_removes_it(bare_host):
    made = _run(ZRAM, "up", "--size", SMALL, env=bare_host)
    assert made.returncode == 0, made.stderr
    (dev,) = _swaps()
    assert dev.startswith("/dev/zram") and dev in made.stdout
    assert (Path(bare_host["FORKD_RUN_DIR"]) / "zram-swap").read_text().split() == [dev, SMALL]
    assert not_in_ram([dev]) == []  # what forkd's idle page-out accepts: zram with no backing device
    again = _run(ZRAM, "up", "--size", SMALL, env=bare_host)
    assert again.returncode == 0 and "nothing to do" in again.stdout and _swaps() == [dev]
    gone = _run(ZRAM, "down", env=bare_host)
    assert gone.returncode == 0 and f"removed {dev}" in gone.stdout, gone.stderr
    assert _swaps() == [] and not Path(f"/sys/block/{dev[5:]}").exists()
    twice = _run(ZRAM, "down", env=bare_host)
    assert twice.returncode == 0 and "nothing to undo" in twice.stdout


def test_undo_removes_only_what_it_made(bare_host):
    """setup.sh --undo-zram removes the device zram.sh recorded, never a zram swap someone else added."""
    assert _run(ZRAM, "up", "--size", SMALL, env=bare_host).returncode == 0
    (ours,) = _swaps()
    other = _run("zramctl", "--find", "--size", SMALL)
    assert other.returncode == 0, other.stderr
    theirs = other.stdout.strip()
    try:
        assert _run("mkswap", theirs).returncode == 0 and _run("swapon", theirs).returncode == 0
        undo = _run(SETUP, "--undo-zram", env=bare_host)
        assert undo.returncode == 0 and f"removed {ours}" in undo.stdout, undo.stderr
        assert _swaps() == [theirs]
    finally:
        _run("swapoff", theirs)
        _run("zramctl", "--reset", theirs)


def test_a_device_made_again_since_is_left_alone(bare_host):
    """A record whose device no longer has the size zram.sh gave it (reset and made again by someone else) is not
    removed: down says so and forgets the record."""
    assert _run(ZRAM, "up", "--size", SMALL, env=bare_host).returncode == 0
    (dev,) = _swaps()
    record = Path(bare_host["FORKD_RUN_DIR"]) / "zram-swap"
    record.write_text(f"{dev} {int(SMALL) * 2}\n")
    try:
        left = _run(ZRAM, "down", env=bare_host)
        assert left.returncode == 0 and "left alone" in left.stderr and _swaps() == [dev]
        assert not record.exists()
    finally:
        record.write_text(f"{dev} {SMALL}\n")  # the fixture's down removes it


def test_a_host_where_zram_cannot_be_loaded_is_told_and_goes_on(bare_host, tmp_path):
    """No zram-control in sysfs even after modprobe (FORKD_ZRAM_SYSFS points at an empty directory): exit 0, a
    warning naming what is missing, no swap made."""
    empty = tmp_path / "sys"
    empty.mkdir()
    res = _run(ZRAM, "up", env={**bare_host, "FORKD_ZRAM_SYSFS": str(empty)})
    assert res.returncode == 0 and "zram cannot be loaded" in res.stderr and "going on" in res.stderr
    assert _swaps() == []


def test_setup_refuses_an_unknown_option_before_doing_anything():
    res = _run(SETUP, "--zram-please")
    assert res.returncode == 2 and "unknown option --zram-please" in res.stderr
    assert "--no-zram" in _run(SETUP, "--help").stdout
