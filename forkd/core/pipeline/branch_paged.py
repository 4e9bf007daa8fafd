"""Live branch by pages: mode `live`'s result (a self-contained snapshot; the source runs on) with diff mode's
pause (forkd.core.pipeline.branch_diff's `ByPages`, sealed as a base).

A child's RAM is its snapshot's flat image plus the pages it wrote since its restore. QEMU's live capture
(`background-snapshot`) write-protects *all* of guest RAM while the source is stopped, so its pause grows with the
RAM. Taking only the written pages and the device state while the source is stopped (VmmDriver.capture_diff)
pauses it for a time that grows with those pages, and the snapshot is then built after the source runs again: the
source's flat image with the pages written over it, sealed as a base (no `parent_tag`: it depends on no other
snapshot's files).

Whether a live branch is taken this way is `plan_branch`'s decision (forkd.core.pipeline.branch_plan) over what
`probe_source` finds here (before anything is written or paused): a disk (live mode copies its overlay while the
guest's filesystem is frozen, and the write-protect capture keeps that instant); a host that cannot scan a VMM's
pages (PAGEMAP_SCAN, Linux 6.7+) or a VMM that does not map the image whole; the pages it wrote; another client
holding its agent (the pages and device state are one instant only while no host byte reaches the guest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkd.base.errors import ForkdError
from forkd.core.pipeline.branch_plan import Probe
from forkd.core.pipeline.branch_source import Source
from forkd.vmm.agent_client import AgentBusy, AgentClient

if TYPE_CHECKING:
    from forkd.core.runtime import Runtime


def probe_source(rt: Runtime, src: Source) -> Probe:
    """What plan_branch needs to know of a live branch's source; nothing is written, paused or held after."""
    probe = Probe(has_disk=src.machine.disk is not None, memory_mib=src.snapshot.memory_mib)
    if probe.has_disk:
        return probe
    with rt.handles.of(src.rec).vmm() as vm:
        problem = rt.driver.diff_capture_problem(vm)
        if problem is not None:
            return Probe(False, probe.memory_mib, pages_problem=problem[0])
        try:
            written = rt.driver.written_pages(vm, rt.store.materialize(src.snapshot.tag))
        except ForkdError as exc:
            return Probe(False, probe.memory_mib, pages_problem=exc.message)
        except OSError as exc:  # its /proc files: a VMM that exits now is the write-protect capture's to report
            return Probe(False, probe.memory_mib, pages_problem=f"its written pages could not be counted: {exc}")
    return Probe(False, probe.memory_mib, written_pages=written, agent_busy=_agent_busy(src))


def _agent_busy(src: Source) -> str | None:
    """Why another client holds the source's agent, or None (the connection tried is closed at once)."""
    try:
        AgentClient.owned(src.files.agent).close()
    except AgentBusy as exc:
        return exc.message
    return None
