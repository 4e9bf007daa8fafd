"""QEMU's side of a DIFF branch: the running child's device state without RAM, plus the guest pages it wrote.

A child's RAM is its snapshot's flat image mapped `MAP_PRIVATE` plus the pages it wrote (forkd.vmm.private_pages),
so a branch of it is a chain layer over its snapshot: those pages and its device state. The source stops only
while both are taken, and for a time that grows with the pages it wrote, not with its RAM:

    before the pause   hand QEMU a buffer for the device state (`add-fd`), size and fault in the page buffer
    pause              `stop` and `xen-save-devices-state` sent together (QEMU's device-state-only save, every
                       device but RAM, `live: false` so the block layer is left alone); once stopped, the private
                       pages are scanned and read while QEMU writes the device state, which is read from the
                       buffer at QEMU's answer (StateBuffer); the caller's `while_paused` (a disk copy); `cont`
                       if it ran
    after              the device state written into the snapshot's file; the pages and their numbers to their
                       files (`PagesTaken.write`, which may run later, in the background)

The device state has no `configuration` section (QEMU writes it only with RAM), so a VMM restoring it is started
with `-global migration.send-configuration=off` (forkd.vmm.qemu detects the format from the file's header).
While the VM is stopped no vCPU runs and no device but one writes guest RAM: virtio-serial still delivers what
arrives on the agent's socket (and, once the host reads a full socket, completes guest output it had held back).
So the caller holds the agent's only host connection and sends nothing on it meanwhile (AgentClient.quiet): pages
and device state are then from one instant. Left: guest output QEMU held back because the host's socket was full
when the pause began, completed during the pause by a read of this process, lands in RAM after the device state
was saved; a child of such a branch may then find its agent port broken (not silently wrong data: the guest's
virtio driver rejects the ring).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.vmm import capture, private_pages
from forkd.vmm.driver import DiffTaken
from forkd.vmm.private_pages import PageCopy, find_mapping
from forkd.vmm.qmp import QMPClient, QMPError

FDSET = 4071  # our fd set id on the child's monitor (removed again after the save)
# QEMU's migration stream (migration/savevm.c): magic "QEVM", version 3, then the configuration section (type 7)
# when the machine sends one; a device-state-only save starts with a device section instead
STREAM_MAGIC = b"QEVM\x00\x00\x00\x03"
SECTION_CONFIGURATION = 7
_PROBED: tuple[bool, str] | None = None
MAX_DEVICE_STATE = 64 << 20  # bytes: a device state is ~80 KB here; more than this is not one


def problem() -> tuple[str, str] | None:
    """Why this host cannot take a diff capture, as (reason, hint), or None (probed once per process)."""
    global _PROBED
    if _PROBED is None:
        _PROBED = private_pages.probe()
    ok, what = _PROBED
    return None if ok else (what, "a diff branch needs Linux 6.7+ (PAGEMAP_SCAN); branch with --mode live or full")


def state_format_args(state_path: Path) -> list[str]:
    """What a VMM loading `state_path` needs on its command line: a stream without a configuration section (a
    diff branch's device state, and everything a VMM restored from one saves) is refused unless the VMM is told
    not to expect one."""
    return [] if has_configuration(state_path) else ["-global", "migration.send-configuration=off"]


def has_configuration(state_path: Path) -> bool:
    """False if `state_path` starts without a configuration section (a device-state-only save)."""
    with open(state_path, "rb") as f:
        head = f.read(len(STREAM_MAGIC) + 1)
    if len(head) < len(STREAM_MAGIC) + 1 or not head.startswith(STREAM_MAGIC):
        raise ForkdError(f"{state_path} is not a QEMU device-state file (bad header)",
                         hint="the snapshot's vmstate is damaged: delete the snapshot and make it again")
    return head[len(STREAM_MAGIC)] == SECTION_CONFIGURATION


class StateBuffer:
    """Where QEMU writes the device state: a memfd of ours, never a descriptor of the snapshot's file. The source's
    VMM keeps running the guest's code after the branch, so it must hold no way to rewrite the snapshot once it is
    sealed: what it wrote is read at its answer, while the VM is still stopped (at most MAX_DEVICE_STATE), and
    anything it writes later goes into a buffer nobody reads. (QEMU truncates the file it is handed, so a pipe is
    refused; the memfd is handed over write-only, as QEMU's fd sets require.)"""

    def __init__(self) -> None:
        self.fd = os.memfd_create("forkd-device-state", os.MFD_CLOEXEC)
        self.data = b""

    def writer(self) -> int:
        """A new write-only descriptor of the buffer, for QEMU (the caller closes it once handed over)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_CLOEXEC)

    def take(self) -> None:
        """Read what QEMU saved (at its answer, while the VM is still stopped: nothing it does later counts)."""
        size = os.fstat(self.fd).st_size
        if size > MAX_DEVICE_STATE:
            raise ForkdError(f"the VMM wrote {size >> 20} MiB of device state (at most {MAX_DEVICE_STATE >> 20})",
                             hint="the source's VMM misbehaves: kill the child; the branch is discarded")
        self.data = os.pread(self.fd, size, 0)
        if len(self.data) < len(STREAM_MAGIC) + 1 or not self.data.startswith(STREAM_MAGIC):
            raise ForkdError(f"the VMM's device-state save left {size} bytes that are not a QEMU device state",
                             hint="retry the branch; if it fails again, branch with --mode live or --mode full")

    def write(self, dest: Path) -> int:
        """Write what `take` read to `dest` (a new file of the snapshot's); the bytes written."""
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(self.data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return len(self.data)

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class PagesTaken(DiffTaken):
    """`write()` writes the pages out (after the source runs again; returns how many) and times itself."""

    timings: dict[str, float]
    copy: PageCopy
    pages: Path

    def discard(self) -> None:
        self.copy.discard()

    def write(self) -> int:
        t0 = time.perf_counter()
        n = self.copy.finish(self.pages)
        self.timings["write"] = (time.perf_counter() - t0) * 1000.0
        self.timings["pages"] = n
        return n


def written_pages(pid: int, mem_path: Path, size: int) -> int:
    """How many pages of its mapping of `mem_path` VMM `pid` holds a private copy of (what `capture_diff` reads)."""
    return sum(b - a for a, b in private_pages.private_ranges(pid, find_mapping(pid, mem_path, size)))


def capture_diff(qmp: QMPClient, pid: int, mem_path: Path, size: int, vmstate: Path, pages: Path, data: Path,
                 while_paused: Callable[[], None] | None = None, written: int | None = None) -> PagesTaken:
    """Stop the VM, save its device state to `vmstate` and read its private guest pages (in its one mapping of
    `mem_path`, `size` bytes; the ones beyond READ_BATCH go to `data` at once), run `while_paused`, resume it if it
    was running. `DiffTaken.write` then writes them out. `written` (a count of them just made) sizes the page
    buffer instead of a scan. Timings (ms): `pause` = stop sent .. `cont` answered, `pause_qemu` = QEMU's STOP ->
    RESUME events."""
    copy = PageCopy(pid, find_mapping(pid, mem_path, size))
    state = StateBuffer()
    t: dict[str, float] = {}
    try:
        t1 = time.perf_counter()
        copy.prepare(written)  # before QEMU holds the buffer: a failure here leaves nothing in its fd set
        t["prepare_pages"] = (time.perf_counter() - t1) * 1000.0
        running = _hand_buffer(qmp, state)
        qmp.events.clear()
        t0 = time.perf_counter()
        try:
            _paused(qmp, copy, state, data, while_paused, t, t0)
        finally:
            _resume(qmp, running, t, t0)
        t["state_bytes"] = state.write(vmstate)
    except BaseException:
        copy.discard()
        raise
    finally:
        state.close()
    stamps = {e["event"]: capture.event_time(e) for e in qmp.events if e.get("event") in ("STOP", "RESUME")}
    if "STOP" in stamps and "RESUME" in stamps:
        t["pause_qemu"] = (stamps["RESUME"] - stamps["STOP"]) * 1000.0
    return PagesTaken(t, copy, pages)


def _hand_buffer(qmp: QMPClient, state: StateBuffer) -> bool:
    """Put the device-state buffer in our fd set (clearing a set a killed branch left behind: QEMU would write
    into its old buffer) and say whether the VM runs; one round trip (QEMU keeps descriptors that came with the
    `add-fd` bytes until that command takes them)."""
    wfd = state.writer()
    try:
        _, status, added = qmp.batch([("remove-fd", {"fdset-id": FDSET}, None), ("query-status", None, None),
                                      ("add-fd", {"fdset-id": FDSET}, [wfd])])
    finally:
        os.close(wfd)  # QEMU holds its own copy, in its fd set
    for answer in (status, added):
        if isinstance(answer, QMPError):
            if not isinstance(added, QMPError):  # QEMU holds the buffer: take it back before giving up
                with suppress(ForkdError, OSError):
                    qmp.execute("remove-fd", {"fdset-id": FDSET})
            raise answer
    return (status or {}).get("status") == "running"


def _resume(qmp: QMPClient, running: bool, t: dict[str, float], t0: float) -> None:
    """`cont` if the VM ran, and the fd set's removal, sent together; `pause` ends at `cont`'s answer."""
    if running:
        qmp.send("cont")
    with suppress(ForkdError, OSError):
        qmp.send("remove-fd", {"fdset-id": FDSET})
    try:
        if running:
            qmp.result("cont")
    finally:
        t["pause"] = (time.perf_counter() - t0) * 1000.0
        with suppress(ForkdError, OSError):
            qmp.result("remove-fd")


def _paused(qmp: QMPClient, copy: PageCopy, state: StateBuffer, data: Path,
            while_paused: Callable[[], None] | None, t: dict[str, float], t0: float) -> None:
    """`stop` and the device-state save go out together; once the VM stopped, the pages are read while QEMU's
    main thread writes the device state (it writes no guest RAM), on the other core."""
    save = "xen-save-devices-state"
    qmp.send("stop")
    qmp.send(save, {"filename": f"/dev/fdset/{FDSET}", "live": False})
    try:
        qmp.result("stop")
        t["stop"] = (time.perf_counter() - t0) * 1000.0
        copy.take(data)
        t["read_pages"] = (time.perf_counter() - t0) * 1000.0 - t["stop"]
    except BaseException:
        with suppress(ForkdError, OSError):
            qmp.result(save)  # its answer must not be taken for the `cont`'s
        raise
    qmp.result(save)
    state.take()
    t["devices"] = (time.perf_counter() - t0) * 1000.0 - t["stop"]
    if while_paused is not None:
        while_paused()
