"""A swap device for the tests that page children out (tests/test_idle_pageout.py, tests/test_branch_diff.py):
the host's own swap if it has some, else a zram device these tests make and remove (real swap, never a stand-in).
Imported by conftest, so every test module can ask for `swap`."""

from __future__ import annotations

import os
import subprocess

import pytest

from forkd.vmm.pageout import not_in_ram, swap_devices, swap_total_kib


@pytest.fixture(scope="module")
def swap():
    """Swap for the module: the host's if it has some, else a free zram device of 1 GiB made swap until the end."""
    if swap_total_kib() > 0:
        if not_in_ram(swap_devices()):
            pytest.skip(f"the host's swap ({', '.join(swap_devices())}) is not all zram: idle page-out refuses it by "
                        "default (FORKD_IDLE_PAGEOUT_DISK); run these tests with zram swap only")
        yield swap_devices()
        return
    if os.geteuid() != 0:
        pytest.skip("needs root to make a zram swap device (the host has no swap)")
    made = subprocess.run(["zramctl", "--find", "--size", "1G"], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no zram device to make swap on: {made.stderr.strip()} (modprobe zram)")
    dev = made.stdout.strip()
    try:
        subprocess.run(["mkswap", dev], check=True, capture_output=True)
        subprocess.run(["swapon", dev], check=True, capture_output=True)
        yield [dev]
    finally:
        subprocess.run(["swapoff", dev], capture_output=True)
        subprocess.run(["zramctl", "--reset", dev], capture_output=True)
