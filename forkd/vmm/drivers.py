"""The VMM driver a node runs, chosen by configuration (FORKD_VMM_DRIVER): the one place a driver class is named."""

from __future__ import annotations

from pathlib import Path

from forkd.base.errors import InvalidInput
from forkd.base.settings import settings
from forkd.vmm.driver import VmmDriver

NAMES = ("qemu", "fake")


def make_driver(overlay_templates: Path | None = None, name: str | None = None) -> VmmDriver:
    """The driver `name` (default: FORKD_VMM_DRIVER); `overlay_templates` is where it may keep fresh disk overlays."""
    name = name or settings().vmm_driver
    if name == "qemu":
        from forkd.vmm.qemu import QemuDriver

        return QemuDriver(overlay_templates=overlay_templates)
    if name == "fake":
        from forkd.vmm.fake import FakeDriver

        return FakeDriver()
    raise InvalidInput(f"unknown VMM driver {name!r} (FORKD_VMM_DRIVER)", hint=f"one of: {', '.join(NAMES)}")
