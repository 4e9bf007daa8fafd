"""A disk-backed source's overlay, as of one instant (forkd.core.pipeline.branch): copied while nothing writes it,
either with the VM paused (the VMM flushed its block layer when it stopped) or, in live mode, with the guest's
root filesystem frozen through its agent (FIFREEZE: written back and flushed, then every writer waits while the
vCPUs run). A freeze the host never lifts lifts itself after FREEZE_MAX_SECONDS."""

from __future__ import annotations

import shutil
import time
from contextlib import suppress
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.vmm.agent_client import AgentClient
from forkd.vmm.driver import Disks

FREEZE_MAX_SECONDS = 10.0  # a frozen source filesystem thaws itself after this, whatever becomes of us


def freeze_fs(agent_socket: Path, timings: dict[str, float]) -> tuple[AgentClient, float] | None:
    """Freeze a disk-backed child's root filesystem through its agent (the guest flushes it, then its writers
    wait; the VM keeps running). None, with nothing frozen, when the agent does not answer at once (another
    host connection holds it) or cannot freeze: the caller then pauses the VM instead."""
    t = time.perf_counter()
    try:
        agent = AgentClient(agent_socket, connect_timeout=0.5)
    except ForkdError:
        return None
    try:
        agent.ping(timeout=0.5)  # answered: the connection is ours, so the freeze runs now or not at all
    except ForkdError:
        agent.close()
        return None
    try:
        agent.call("fsfreeze", {"freeze": True, "max_seconds": FREEZE_MAX_SECONDS}, timeout=FREEZE_MAX_SECONDS / 2)
    except ForkdError:  # e.g. an older agent without fsfreeze, or a flush that takes too long
        with suppress(ForkdError, OSError):
            agent.call("fsfreeze", {"freeze": False}, timeout=FREEZE_MAX_SECONDS)
        agent.close()
        return None
    timings["fs_freeze"] = (time.perf_counter() - t) * 1000.0
    return agent, time.perf_counter()


def thaw_fs(frozen: tuple[AgentClient, float], timings: dict[str, float]) -> None:
    """Thaw the source's filesystem; if that fails the guest thaws itself after FREEZE_MAX_SECONDS.
    `fs_frozen` is how long the guest's writers waited (from the freeze's answer to the thaw's)."""
    agent, frozen_at = frozen
    t = time.perf_counter()
    try:
        agent.call("fsfreeze", {"freeze": False}, timeout=FREEZE_MAX_SECONDS)
        timings["fs_thaw"] = (time.perf_counter() - t) * 1000.0
        timings["fs_frozen"] = (time.perf_counter() - frozen_at) * 1000.0
    except (ForkdError, OSError):
        timings["fs_thaw_failed"] = 1.0
    finally:
        agent.close()


def copy_disk(disk: Path, dest: Path, backing: Path, timings: dict[str, float], disks: Disks) -> None:
    """Copy a child's overlay while nothing writes it (VM paused: the VMM flushed it when it stopped; or guest
    filesystem frozen: the guest flushed it): the branch's disk as of now. Its VMM wrote the header, so the copy is
    refused unless it still names `backing` and nothing else (`disks.check_written`)."""
    t = time.perf_counter()
    shutil.copyfile(disk, dest)
    disks.check_written(dest, backing)
    timings["disk_copy"] = (time.perf_counter() - t) * 1000.0
